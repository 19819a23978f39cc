#!/usr/bin/env bash
# bench/gpu/prove.sh — on the GPU machine, with the binaries bench/gpu/pack.sh put in
# .gpu-carry/: the verification of every GPU path, in parts that each fit one 10-minute call.
#
#   bench/gpu/prove.sh tests   # every GPU test binary on the GPU; none may skip (about 3-5 min)
#   bench/gpu/prove.sh check   # bench/gpu-check: conformance + CPU-vs-GPU loss curves
#   bench/gpu/prove.sh bench   # sinter_gpu_bench.sh all, then train_bench.sh all
#   bench/gpu/prove.sh profile # GPU time per kernel of 3 GPT-2 bf16 training steps (ncu)
#   bench/gpu/prove.sh speed   # issue 24's measured goals in one call of under 8 minutes:
#                              # attention beside SDPA's cudnn and flash backends, GPT-2 at
#                              # batch 16 and 64 beside eager and torch.compile, BERT, and the
#                              # cost model's prediction of the same steps (calibration)
#
# Each part writes under $OUT (else bench/gpu/out/prove) and packs everything it wrote into
# $OUT/<part>.tgz, since the device tool returns only files at most two folders down.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${ROOT}"
PART="${1:-tests}"
CARRY="${CARRY:-.gpu-carry}"
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-bench/gpu/out/prove}"
mkdir -p "${OUT_DIR}"
OUT_DIR="$(cd "${OUT_DIR}" && pwd)"
# pack.sh carries the binaries xz-compressed: unpack them once beside the tree (xz, else
# Python's lzma), and run them from there.
if [[ -f "${CARRY}/sinter.xz" ]]; then
    UNPACKED="${ROOT}/.gpu-carry-unpacked"
    mkdir -p "${UNPACKED}"
    for z in "${CARRY}"/*.xz; do
        bin="${UNPACKED}/$(basename "${z}" .xz)"
        [[ -x "${bin}" && "${bin}" -nt "${z}" ]] && continue
        if command -v xz > /dev/null; then
            xz -dc "${z}" > "${bin}"
        else
            "${PYTHON}" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "${z}" "${bin}"
        fi || { echo "prove: could not unpack ${z}" >&2; exit 2; }
        chmod +x "${bin}"
    done
    CARRY="${UNPACKED}"
fi
[[ -x "${CARRY}/sinter" ]] || { echo "prove: ${CARRY}/sinter missing: run bench/gpu/pack.sh on the build machine and carry ${CARRY}" >&2; exit 2; }
# shellcheck source=bench/gpu/cuda_env.sh
source "${ROOT}/bench/gpu/cuda_env.sh"
cuda_env
# Without this a GPU test finding no usable GPU would run on the emulated CUDA device (or skip):
# here that is a failure.
export SINTER_REQUIRE_GPU=1
unset SINTER_CUDA_EMU
nvidia-smi > "${OUT_DIR}/nvidia-smi.txt" 2>&1 || true
ngpu="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
rc=0
case "${PART}" in
tests)
    for t in conformance gpu graph_gpu emulated_e2e nccl_backend nccl_device; do
        [[ -x "${CARRY}/${t}" ]] || { echo "prove: ${CARRY}/${t} missing" >&2; rc=1; continue; }
        echo "== ${t}"
        timeout 240 "${CARRY}/${t}" --test-threads=1 --nocapture > "${OUT_DIR}/${t}.txt" 2>&1
        r=$?
        grep -E "^test result:" "${OUT_DIR}/${t}.txt" | tail -n1
        if [[ ${r} -ne 0 ]]; then
            echo "FAIL ${t} (exit ${r}):"; grep -E "^test .* FAILED$|panicked" "${OUT_DIR}/${t}.txt" | head -20
            rc=1
        fi
        # A skip is a failure here, except the two-rank NCCL tests on a one-GPU machine (NCCL
        # takes one GPU per rank): those are listed, not counted.
        skips="$(grep "skipped" "${OUT_DIR}/${t}.txt" || true)"
        if [[ "${ngpu}" -lt 2 ]]; then
            grep "need two GPUs" <<< "${skips}" | sed "s/^/note ${t} (${ngpu} GPU): /" | sort -u
            skips="$(grep -v "need two GPUs" <<< "${skips}" || true)"
        fi
        n="$(grep -c . <<< "${skips}" || true)"
        [[ "${n}" -gt 0 ]] && { echo "FAIL ${t}: ${n} skipped line(s) on the GPU machine:"; sort <<< "${skips}" | uniq -c | head; rc=1; }
    done
    ;;
check)
    SINTER="${CARRY}/sinter" CONFORMANCE="${CARRY}/conformance" OUT="${OUT_DIR}/gpu-check" \
        timeout 560 bench/gpu-check || rc=$?
    ;;
bench)
    SINTER="${CARRY}/sinter" OUT="${OUT_DIR}/kernels" timeout 280 bench/gpu/sinter_gpu_bench.sh all || rc=$?
    SINTER="${CARRY}/sinter" OUT="${OUT_DIR}/train" timeout 280 bench/gpu/train_bench.sh all || rc=$?
    ;;
profile)
    # Where a GPT-2 124M bf16 step (batch 16, T 1024) spends its GPU time: ncu times every kernel
    # (serialised, so the sum is pure kernel time), bench/gpu/ncu_summary.py groups them by name.
    NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)"
    [[ -n "${NCU}" ]] || { echo "prove: ncu not found" >&2; exit 2; }
    "${CARRY}/sinter" tokenize text:data/tinyshakespeare.txt --out "${OUT_DIR}/tokens" --quiet || rc=$?
    timeout 400 "${NCU}" --metrics gpu__time_duration.sum --csv --log-file "${OUT_DIR}/ncu.csv" \
        "${CARRY}/sinter" train --quiet --model gpt2 --data "tokens:${OUT_DIR}/tokens" --device cuda \
        --precision bf16 --batch-size 16 --context 1024 --steps 3 --log-interval 1 --eval-interval 4 \
        --checkpoint-interval 4 --eval-batches 1 --out "${OUT_DIR}/profile-run" --overwrite > "${OUT_DIR}/ncu-run.log" 2>&1 || rc=$?
    "${PYTHON}" bench/gpu/ncu_summary.py "${OUT_DIR}/ncu.csv" --divide 3 --top 40 | tee "${OUT_DIR}/profile.txt" || rc=$?
    gzip -f "${OUT_DIR}/ncu.csv"
    ;;
speed)
    D="${OUT_DIR}/speed"
    mkdir -p "${D}"
    # sinter's attention through each backend (about 10 s each: 4 shapes, 1 s of timing each).
    for b in cudnn flash; do
        SINTER_ATTENTION="${b}" timeout 25 "${CARRY}/sinter" bench gpu attention \
            --out "${D}/sinter_attention_${b}.md" > "${D}/sinter_attention_${b}.log" 2>&1 || rc=$?
    done
    for b in cudnn flash; do
        timeout 45 "${PYTHON}" bench/gpu/torch_sdpa.py --backend "${b}" > "${D}/sdpa_${b}.jsonl" 2> "${D}/sdpa_${b}.log" || rc=$?
    done
    "${PYTHON}" bench/gpu/attention_table.py "${D}" | tee "${D}/attention.md" || rc=$?
    for batch in 16 64; do
        SINTER="${CARRY}/sinter" OUT="${D}/gpt2_b${batch}" GPT2_BATCH="${batch}" STEPS=30 LOG=10 \
            timeout 150 bench/gpu/train_bench.sh gpt2 || rc=$?
        # The cost model's prediction of the same step, for the calibration table in RESULTS.md.
        timeout 60 "${CARRY}/sinter" bench gpu-model --model gpt2 --batch-size "${batch}" --context 1024 \
            --precision bf16 > "${D}/predicted_b${batch}.md" 2>&1 || rc=$?
    done
    SINTER="${CARRY}/sinter" OUT="${D}/bert" STEPS=30 LOG=10 timeout 60 bench/gpu/train_bench.sh bert || rc=$?
    ;;
*)
    echo "prove: unknown part '${PART}'; valid: tests, check, bench, profile, speed" >&2
    exit 2
    ;;
esac
tar czf "${OUT_DIR}/${PART}.tgz" -C "${OUT_DIR}" --exclude '*.tgz' --exclude '.cache' --exclude '.lib' --exclude 'tokens' --exclude '*.safetensors' . 2>/dev/null
echo "prove ${PART}: exit ${rc}; everything is in ${OUT_DIR}/${PART}.tgz"
exit ${rc}
