#!/usr/bin/env bash
# bench/gpu/pack.sh — on the build machine (it has Rust; the GPU machine has not): build the
# release binary and every GPU test binary, and copy them under stable names into .gpu-carry/
# (git-ignored), the one folder a `run` call on the GPU machine needs to carry:
#
#   bench/gpu/pack.sh
#   run: command "bench/gpu/prove.sh tests" (then "check", then "bench"), carry [".gpu-carry"]
#
# The carried tree must stay under 64 MiB: the script prints the folder's size and fails above
# 60 MiB. Knobs: CARGO (default cargo).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${ROOT}"
CARGO="${CARGO:-cargo}"
DEST=.gpu-carry
# crate:test — the GPU tests (without a GPU they run on the emulated CUDA device; on the GPU
# machine prove.sh sets SINTER_REQUIRE_GPU=1 so they must run on the GPU).
TESTS=(
    sinter-core:conformance
    sinter-cuda:gpu
    sinter-cuda:graph_gpu
    sinter-models:emulated_e2e
    sinter-dist:nccl_backend
    sinter-dist:nccl_device
)
"${CARGO}" build --release -p sinter
rm -rf "${DEST}"
mkdir -p "${DEST}"
strip -o "${DEST}/sinter" "${CARGO_TARGET_DIR:-target}/release/sinter"
for t in "${TESTS[@]}"; do
    crate="${t%%:*}" name="${t##*:}"
    # The path of the test executable, from cargo's JSON messages.
    exe="$("${CARGO}" test --release --no-run -p "${crate}" --test "${name}" --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -n1)"
    [[ -n "${exe}" && -x "${exe}" ]] || { echo "pack: no executable for ${crate} --test ${name}" >&2; exit 1; }
    strip -o "${DEST}/${name}" "${exe}"
done
size_kb="$(du -sk "${DEST}" | cut -f1)"
echo "pack: ${DEST} holds $(ls "${DEST}" | wc -l) binaries, $((size_kb / 1024)) MiB"
if (( size_kb > 60 * 1024 )); then
    echo "pack: ${DEST} is over 60 MiB; the GPU machine takes 64 MiB with the whole tree" >&2
    exit 1
fi
