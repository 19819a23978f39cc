#!/usr/bin/env bash
# bench/gpu/train_bench.sh — GPT-2 124M and BERT-base training on the GPU machine: sinter beside
# PyTorch in the same run, on the same data shapes.
#
#   GPT-2 124M, bf16, T = 1024, batch GPT2_BATCH: tokens/s, MFU and peak memory for sinter,
#     PyTorch eager and PyTorch torch.compile (both with scaled_dot_product_attention).
#   BERT-base MLM, T = 128, batch BERT_BATCH, FP32 and FP16: sequences/s for sinter and
#     PyTorch eager (as Hugging Face runs it: the MLM head on every position; and with the
#     head on the masked rows only, which is what sinter does).
#
# sinter trains on GPT-2 tokens of the bundled tiny Shakespeare (`sinter tokenize`, offline);
# PyTorch on random tokens of the same vocabulary (throughput does not depend on the values).
# sinter's BERT gets the data's vocabulary plus a mask token (50258), so PyTorch's BERT is run
# with --vocab-size 50258 too. sinter's rate is its last logged window (LOG steps), which
# excludes the warm-up steps (NVRTC compiles, allocator growth).
#
# From the repository root, with a release binary built on the build machine:
#
#   cargo build --release -p sinter
#   bench/gpu/train_bench.sh [gpt2|bert|all]
#
# Through the `run` device tool: command "bench/gpu/train_bench.sh all", carry
# ["target/release/sinter"]; results come back under $OUT (else bench/gpu/out/train/).
# Knobs: SINTER, PYTHON, OUT, GPT2_BATCH (16), BERT_BATCH (32), STEPS (40), LOG (10),
# SINTER_FLAGS (extra `sinter train` flags, e.g. "--recompute block").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${ROOT}"
WHICH="${1:-all}"
SINTER="${SINTER:-target/release/sinter}"
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-bench/gpu/out/train}"
GPT2_BATCH="${GPT2_BATCH:-16}"
BERT_BATCH="${BERT_BATCH:-32}"
STEPS="${STEPS:-40}"
LOG="${LOG:-10}"
SINTER_FLAGS="${SINTER_FLAGS:-}"
mkdir -p "${OUT_DIR}"
OUT_DIR="$(cd "${OUT_DIR}" && pwd)"
RESULTS="${OUT_DIR}/results.jsonl"
: > "${RESULTS}"

die() { echo "train_bench: error: $*" >&2; exit 1; }
case "${WHICH}" in gpt2|bert|all) ;; *) die "unknown benchmark '${WHICH}'; valid: gpt2, bert, all" ;; esac
[[ -x "${SINTER}" ]] || die "${SINTER} not found: build it with 'cargo build --release -p sinter' and carry target/release/sinter"

# shellcheck source=bench/gpu/cuda_env.sh
source "${ROOT}/bench/gpu/cuda_env.sh"
cuda_env

echo "== GPT-2 tokens of tiny Shakespeare"
"${SINTER}" tokenize text:data/tinyshakespeare.txt --out "${OUT_DIR}/tokens" --quiet

# sinter_run NAME MODEL PRECISION BATCH CONTEXT: one `sinter train`, its summary as a JSON line.
sinter_run() {
    local name="$1" model="$2" precision="$3" batch="$4" context="$5" dir="${OUT_DIR}/runs/$1"
    rm -rf "${dir}"
    mkdir -p "${OUT_DIR}/runs"
    echo "== sinter ${name}: ${model} ${precision} batch ${batch} × ${context}"
    # shellcheck disable=SC2086
    if ! "${SINTER}" train --quiet --model "${model}" --data "tokens:${OUT_DIR}/tokens" \
        --device cuda --precision "${precision}" --batch-size "${batch}" --context "${context}" \
        --steps "${STEPS}" --log-interval "${LOG}" --eval-interval "$((STEPS + 1))" --eval-batches 1 \
        --checkpoint-interval "$((STEPS + 1))" --out "${dir}" ${SINTER_FLAGS} 2> "${dir}.log"; then
        echo "sinter ${name} failed:" >&2
        tail -20 "${dir}.log" >&2
        echo "{\"bench\": \"sinter\", \"name\": \"${name}\", \"error\": \"see runs/${name}.log\"}" >> "${RESULTS}"
        return 0
    fi
    "${PYTHON}" - "${dir}/summary.json" "${name}" "${context}" >> "${RESULTS}" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"bench": "sinter", "name": sys.argv[2], "seq": int(sys.argv[3]),
                  "batch_size": s["batch_size"], "parameters": s["parameters"],
                  "tokens_per_s": s.get("last_logged_rate") or s.get("tokens_per_s"),
                  "peak_mem_gib": (s.get("peak_device_memory_bytes") or 0) / 2**30,
                  "loss": s.get("train_loss")}))
EOF
}

# torch_run NAME SCRIPT ARGS...: one PyTorch baseline; its JSON lines, tagged with NAME.
torch_run() {
    local name="$1" script="$2"
    shift 2
    echo "== torch ${name}"
    if ! "${PYTHON}" "bench/gpu/${script}" "$@" > "${OUT_DIR}/${name}.json" 2> "${OUT_DIR}/${name}.log"; then
        echo "torch ${name} failed:" >&2
        tail -20 "${OUT_DIR}/${name}.log" >&2
        echo "{\"bench\": \"torch\", \"name\": \"${name}\", \"error\": \"see ${name}.log\"}" >> "${RESULTS}"
        return 0
    fi
    "${PYTHON}" - "${OUT_DIR}/${name}.json" "${name}" >> "${RESULTS}" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line)
        d["name"] = sys.argv[2] + (f"_{d['precision']}" if "precision" in d else "")
        print(json.dumps(d))
EOF
}

if [[ "${WHICH}" == gpt2 || "${WHICH}" == all ]]; then
    sinter_run gpt2_bf16 gpt2 bf16 "${GPT2_BATCH}" 1024
    torch_run torch_gpt2_eager torch_gpt2_train.py --batch-size "${GPT2_BATCH}" --mode eager --steps "${STEPS}"
    torch_run torch_gpt2_compile torch_gpt2_train.py --batch-size "${GPT2_BATCH}" --mode compile --steps "${STEPS}"
fi
if [[ "${WHICH}" == bert || "${WHICH}" == all ]]; then
    sinter_run bert_fp32 bert-base fp32 "${BERT_BATCH}" 128
    sinter_run bert_fp16 bert-base fp16 "${BERT_BATCH}" 128
    torch_run torch_bert torch_bert_train.py --batch-size "${BERT_BATCH}" --precision both \
        --steps "${STEPS}" --vocab-size 50258
    # sinter runs the MLM head on the masked rows only; PyTorch given the same trick:
    torch_run torch_bert_maskedhead torch_bert_train.py --batch-size "${BERT_BATCH}" --precision both \
        --steps "${STEPS}" --vocab-size 50258 --masked-head
fi

echo
"${PYTHON}" - "${RESULTS}" <<'EOF' | tee "${OUT_DIR}/train_bench.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["name"]: r for r in rows}
PEAK = 989e12  # dense BF16, H100/H200 SXM

def gpt2_flops_per_token(params, seq, n_layer=12, width=768):
    # 6N + 6·L·C·T, N without the position table (as torch_gpt2_train.py counts it).
    return 6 * (params - 1024 * width) + 6 * n_layer * width * seq

def fmt(x, spec):
    return "—" if x is None else format(x, spec)

print("## GPT-2 124M training, bf16, T = 1024\n")
print("| system | tokens/s | MFU | peak GiB | vs torch.compile |")
print("|---|---:|---:|---:|---:|")
base = by.get("torch_gpt2_compile", {}).get("tokens_per_s")
for name, label in [("gpt2_bf16", "sinter"), ("torch_gpt2_eager", "PyTorch eager"), ("torch_gpt2_compile", "PyTorch torch.compile")]:
    r = by.get(name)
    if r is None:
        continue
    if "error" in r:
        print(f"| {label} | failed: {r['error']} | | | |")
        continue
    tps = r.get("tokens_per_s")
    if "mfu" in r:
        mfu = r["mfu"]
    elif tps and r.get("parameters"):
        mfu = tps * gpt2_flops_per_token(r["parameters"], r["seq"]) / PEAK
    else:
        mfu = None
    ratio = tps / base if tps and base else None
    print(f"| {label} | {fmt(tps, ',.0f')} | {fmt(mfu and mfu * 100, '.1f')}% | {fmt(r.get('peak_mem_gib'), '.1f')} | {fmt(ratio, '.2f')} |")

print("\n## BERT-base MLM training, T = 128\n")
print("| system | precision | sequences/s | vs PyTorch eager |")
print("|---|---|---:|---:|")
for prec, tname in [("fp32", "torch_bert_fp32"), ("fp16", "torch_bert_amp16")]:
    t = by.get(tname, {})
    t_sps = t.get("sequences_per_s")
    s = by.get(f"bert_{prec}")
    if s is not None:
        if "error" in s:
            print(f"| sinter | {prec} | failed: {s['error']} | |")
        else:
            sps = s["tokens_per_s"] / s["seq"] if s.get("tokens_per_s") else None
            print(f"| sinter | {prec} | {fmt(sps, ',.0f')} | {fmt(sps / t_sps if sps and t_sps else None, '.2f')} |")
    if t:
        print(f"| PyTorch eager | {prec} | {fmt(t_sps, ',.0f')} | 1.00 |")
    mh = by.get(tname.replace("torch_bert", "torch_bert_maskedhead"), {}).get("sequences_per_s")
    if mh:
        print(f"| PyTorch eager, MLM head on masked rows | {prec} | {fmt(mh, ',.0f')} | {fmt(mh / t_sps if t_sps else None, '.2f')} |")
EOF
echo
echo "wrote ${OUT_DIR}/{results.jsonl,train_bench.md} and runs/"
