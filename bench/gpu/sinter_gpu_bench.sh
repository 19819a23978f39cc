#!/usr/bin/env bash
# bench/gpu/sinter_gpu_bench.sh — sinter's GPU benchmarks beside torch.matmul, on the GPU machine.
#
# Runs `sinter bench gpu <which> --out OUT/sinter_gpu.md` (GEMM, tensor cores, Linear CPU vs GPU,
# bandwidth-bound kernels, fused attention) and bench/gpu/torch_gemm.py / torch_sdpa.py, then prints
# sinter / torch for each GEMM and each attention shape.
# From the repository root, with a release binary built elsewhere (the GPU machine has no Rust):
#
#   cargo build --release -p sinter                      # on the build machine
#   bench/gpu/sinter_gpu_bench.sh [all|gemm|tc|linear|bandwidth|attention]
#
# Through the `run` device tool: command "bench/gpu/sinter_gpu_bench.sh all", carry
# ["target/release/sinter"]; results come back under $OUT (else bench/gpu/out/).
# Knobs: SINTER (binary, default target/release/sinter), OUT, PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${ROOT}"
WHICH="${1:-all}"
SINTER="${SINTER:-target/release/sinter}"
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-bench/gpu/out}"
mkdir -p "${OUT_DIR}"

die() { echo "sinter_gpu_bench: error: $*" >&2; exit 1; }

# shellcheck source=bench/gpu/cuda_env.sh
source "${ROOT}/bench/gpu/cuda_env.sh"

[[ -x "${SINTER}" ]] || die "${SINTER} not found: build it with 'cargo build --release -p sinter' and carry target/release/sinter"
cuda_env

echo "== sinter bench gpu ${WHICH}"
"${SINTER}" bench gpu "${WHICH}" --out "${OUT_DIR}/sinter_gpu.md"

if [[ "${WHICH}" == "all" || "${WHICH}" == "gemm" || "${WHICH}" == "tc" ]]; then
    echo
    echo "== torch.matmul"
    "${PYTHON}" bench/gpu/torch_gemm.py --json "${OUT_DIR}/torch_gemm.json" | tee "${OUT_DIR}/torch_gemm.md"
    echo
    "${PYTHON}" - "${OUT_DIR}/sinter_gpu.json" "${OUT_DIR}/torch_gemm.json" <<'EOF' | tee "${OUT_DIR}/sinter_vs_torch.md"
import json, sys
s = json.load(open(sys.argv[1]))
t = json.load(open(sys.argv[2]))
pairs = []
for n in (4096, 8192):
    pairs.append((f"bf16 {n}^3", s.get("gemm", {}).get(f"bf16_{n}"), t.get(f"bf16_{n}")))
for k in ("fp32", "tf32", "bf16", "fp16"):
    pairs.append((f"{k} 8192^3", s.get("tc", {}).get(k), t.get(f"{k}_8192")))
print(f"## sinter vs torch.matmul ({t.get('device')}, torch {t.get('torch')})\n")
print("| GEMM | sinter TFLOP/s | torch TFLOP/s | sinter / torch |")
print("|---|---:|---:|---:|")
for name, a, b in pairs:
    if a is None or b is None:
        continue
    print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
EOF
fi
if [[ "${WHICH}" == "all" || "${WHICH}" == "attention" ]]; then
    echo
    echo "== torch scaled_dot_product_attention"
    "${PYTHON}" bench/gpu/torch_sdpa.py > "${OUT_DIR}/torch_sdpa.jsonl"
    "${PYTHON}" - "${OUT_DIR}/sinter_gpu.json" "${OUT_DIR}/torch_sdpa.jsonl" <<'EOF' | tee "${OUT_DIR}/attention_vs_torch.md"
import json, sys
s = json.load(open(sys.argv[1])).get("attention", {})
rows = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
print("## Attention fwd+bwd, causal bf16: sinter fused vs torch SDPA\n")
print("| T | head dim | sinter TFLOP/s | torch TFLOP/s | sinter / torch |")
print("|---:|---:|---:|---:|---:|")
for r in rows:
    mine = s.get(f"t{r['seq']}_d{r['head_dim']}", {}).get("fwd_bwd_tflops")
    theirs = r.get("fwd_bwd_tflops")
    if mine and theirs:
        print(f"| {r['seq']} | {r['head_dim']} | {mine:.1f} | {theirs:.1f} | {mine / theirs:.2f} |")
EOF
fi
echo
echo "wrote ${OUT_DIR}/{sinter_gpu.md,sinter_gpu.json,torch_gemm.json,sinter_vs_torch.md,...}"
