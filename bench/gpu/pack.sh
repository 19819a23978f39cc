#!/usr/bin/env bash
# bench/gpu/pack.sh — on the build machine (it has Rust; the GPU machine has not): build the
# release binary and every GPU test binary, and copy them under stable names into .gpu-carry/
# (git-ignored), the one folder a `run` call on the GPU machine needs to carry:
#
#   bench/gpu/pack.sh
#   run: command "bench/gpu/prove.sh tests" (then "check", then "bench"), carry [".gpu-carry"]
#
# Everything a `run` call takes (the tracked tree and the carry) must stay under 64 MiB: the
# binaries go xz-compressed (NAME.xz, ~3.7x smaller; prove.sh unpacks them), and the script
# prints the total and fails above 60 MiB. Knobs: CARGO (default cargo).
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
# Strips a binary into the carry, xz-compressed (uncompressed the six binaries and the tree
# came to over 60 MiB in session 24).
carry() {
    strip -o "${DEST}/$2" "$1"
    xz -T0 -6 -f "${DEST}/$2"
}
carry "${CARGO_TARGET_DIR:-target}/release/sinter" sinter
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
    carry "${exe}" "${name}"
done
size_kb="$(du -sk "${DEST}" | cut -f1)"
tree_kb="$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -n1 | cut -f1)"
echo "pack: ${DEST} holds $(ls "${DEST}" | wc -l) compressed binaries, $((size_kb / 1024)) MiB; with the tracked tree's $((tree_kb / 1024)) MiB: $(((size_kb + tree_kb) / 1024)) MiB"
if (( size_kb + tree_kb > 60 * 1024 )); then
    echo "pack: the carry and the tree come to over 60 MiB; a run call takes 64 MiB in all" >&2
    exit 1
fi
