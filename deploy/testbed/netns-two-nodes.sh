#!/usr/bin/env bash
# Two "machines" on one: two network namespaces joined by veth pairs and a bridge, with
# private addresses of their own (10.254.32.1 and .2). One `sinter launch --nnodes 2` runs in
# each and trains the MLP a few steps; the final weights must equal a one-process run with
# the doubled batch (within f32 rounding) and, bit for bit, the same two-node run over a
# link with `tc netem delay 20ms loss 1%`, whose slowdown is reported (where the kernel has
# sch_netem; elsewhere that part is skipped, saying so). About 2 s with a debug build.
#
#   deploy/testbed/netns-two-nodes.sh [path/to/sinter]     (as root; default target/debug/sinter)
#
# Skips (exit 0, saying why) when not root or when network namespaces, veth or bridges are
# unavailable. Everything is bounded in time, and a trap removes the namespaces, links,
# processes and files it made, whatever happens.
set -euo pipefail

BIN=$(readlink -f "${1:-${CARGO_TARGET_DIR:-target}/debug/sinter}")
STEPS=${STEPS:-12}
LIMIT_S=${LIMIT_S:-120}            # per launcher run
ID=$$
NS=(stb${ID}n0 stb${ID}n1)
BR=stb${ID}br
VA=(stb${ID}a0 stb${ID}a1)         # bridge ends
VB=(stb${ID}b0 stb${ID}b1)         # namespace ends
ADDR=(10.254.32.1 10.254.32.2)
PORT=29500
TMP=$(mktemp -d /tmp/sinter-netns.XXXXXX)
PIDS=()

skip() { echo "SKIP: $*"; exit 0; }
die() { echo "FAIL: $*" >&2; exit 1; }

cleanup() {
    local rc=$?
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for n in "${NS[@]}"; do
        # Anything still running inside a namespace this script made.
        for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
        ip netns del "$n" 2>/dev/null || true
    done
    for l in "${VA[@]}" "$BR"; do ip link del "$l" 2>/dev/null || true; done
    rm -rf "$TMP"
    left=$(ip netns list 2>/dev/null | grep -c "^stb${ID}" || true)
    [ "$left" = 0 ] || echo "cleanup: $left namespace(s) left" >&2
    exit "$rc"
}

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "no ip(8)"
[ -x "$BIN" ] || die "no sinter binary at $BIN (build it, or pass its path)"
trap cleanup EXIT INT TERM
ip netns add "${NS[0]}" 2>/dev/null || skip "ip netns unavailable"
ip netns add "${NS[1]}"
ip link add "$BR" type bridge 2>/dev/null || skip "no bridge support"
ip link set "$BR" up
for i in 0 1; do
    ip link add "${VA[$i]}" type veth peer name "${VB[$i]}" 2>/dev/null || skip "no veth support"
    ip link set "${VB[$i]}" netns "${NS[$i]}"
    ip link set "${VA[$i]}" master "$BR" up
    ip netns exec "${NS[$i]}" ip link set lo up
    ip netns exec "${NS[$i]}" ip addr add "${ADDR[$i]}/24" dev "${VB[$i]}"
    ip netns exec "${NS[$i]}" ip link set "${VB[$i]}" up
done
# A link that does not carry ends the run at the collective timeout, naming the peer.
export SINTER_COLLECTIVE_TIMEOUT_S=${SINTER_COLLECTIVE_TIMEOUT_S:-60}

train=(train --quiet --model mlp --steps "$STEPS" --seed 3 --eval-batches 1 --eval-interval 1000
       --checkpoint-interval "$STEPS")

# Both nodes, one rank each; prints the wall time in milliseconds.
two_nodes() {
    local out=$1 t0 t1
    t0=$(date +%s%N)
    PIDS=()
    for i in 0 1; do
        ip netns exec "${NS[$i]}" timeout -s KILL "$LIMIT_S" "$BIN" launch --nproc-per-node 1 \
            --nnodes 2 --node-rank "$i" --master-addr "${ADDR[0]}" --master-port "$PORT" \
            --grace-period 2 -- "${train[@]}" --batch-size 16 --out "$out" \
            >"$out.node$i.log" 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1; do
        wait "${PIDS[$i]}" || { cat "$out.node$i.log" >&2; die "node $i failed ($out)"; }
    done
    PIDS=()
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}

# check A B [exact]: B's model weights equal A's (relative L2 per tensor below 1e-5, or bit
# for bit with `exact`).
check() {
    python3 - "$@" <<'PY'
import json, struct, sys
import numpy as np

def tensors(d):
    b = open(f"{d}/checkpoint.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    head.pop("__metadata__", None)
    data = b[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32)
            for k, v in head.items() if v["dtype"] == "F32" and k.startswith("model.")}

a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a and a.keys() == b.keys(), "different or no model tensors"
if len(sys.argv) > 3:
    assert all(np.array_equal(a[k], b[k]) for k in a), f"{sys.argv[2]} differs from {sys.argv[1]}"
else:
    worst = max(np.linalg.norm(b[k] - a[k]) / max(np.linalg.norm(a[k]), 1e-12) for k in a)
    assert worst < 1e-5, f"relative L2 {worst:.2e} between {sys.argv[1]} and {sys.argv[2]}"
    print(f"weights: two nodes = one process (worst relative L2 {worst:.1e})")
PY
}

"$BIN" "${train[@]}" --batch-size 32 --out "$TMP/one" >"$TMP/one.log" 2>&1 \
    || { cat "$TMP/one.log" >&2; die "the one-process run failed"; }
t_clean=$(two_nodes "$TMP/clean")
check "$TMP/one" "$TMP/clean"
echo "two nodes, $STEPS MLP steps over the bridge: ${t_clean} ms"
netem=1
for i in 0 1; do
    ip netns exec "${NS[$i]}" tc qdisc add dev "${VB[$i]}" root netem delay 20ms loss 1% \
        2>/dev/null || netem=0
done
if [ "$netem" = 1 ]; then
    t_netem=$(two_nodes "$TMP/netem")
    check "$TMP/clean" "$TMP/netem" exact
    echo "with netem delay 20ms loss 1%: ${t_netem} ms" \
        "($(python3 -c "print(f'{$t_netem / $t_clean:.1f}')")x slower), same weights bit for bit"
else
    echo "SKIP (part): tc netem is unavailable here (no sch_netem in this kernel); delay and loss not tested"
fi
echo "PASS"
