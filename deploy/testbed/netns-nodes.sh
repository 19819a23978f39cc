#!/usr/bin/env bash
# Several "machines" on one: network namespaces joined by veth pairs and a bridge, with private
# addresses of their own (10.254.32.1 …), one `sinter launch --nnodes N` per namespace, one
# rank each, training the MLP on digits. What it checks:
#
#   1. 2 and 4 nodes end with the weights of one process with the N-fold batch (f32 rounding);
#   2. MPI across the nodes: `mpirun` in node 0 with `ip netns exec` as its rsh agent, DP under
#      `--dist-backend auto` (= MPI under mpirun) ends with one process's weights; MPI's
#      all-reduce bus bandwidth over the bridge (skipped, saying so, without mpirun or a binary
#      built with MPI);
#   3. a lossy link (1 % of packets dropped at every node by iptables' statistic match, and
#      `tc netem delay 20ms` where the kernel has sch_netem) gives the same weights bit for bit,
#      slower (the slowdown is printed);
#   4. a partition: one node of 4 cut off (iptables DROP on its link) after the run's first
#      checkpoint ends the round within the collective timeout, the ranks' errors naming the
#      operation, its sequence number and the rank waited for (node = rank here); with
#      `--max-restarts 1` and the link healed, the launchers restart the group from the last
#      checkpoint and it ends with the undisturbed 4-node run's weights, bit for bit;
#   5. a node's launcher killed (SIGKILL): its rank dies with it, its namespace empties, and
#      with `--min-nodes 3` the other three restart the group at world size 3 from the
#      checkpoint and finish.
#
#   deploy/testbed/netns-nodes.sh [path/to/sinter]     (as root; default target/debug/sinter)
#
# Skips (exit 0, saying why) when not root or when network namespaces, veth or bridges are
# unavailable; skips a part (saying so) when iptables, netem or MPI is (the killed launcher
# needs none of them). Everything is bounded in time, and a trap removes the namespaces,
# links, processes and files it made, whatever happens.
set -euo pipefail

BIN=$(readlink -f "${1:-${CARGO_TARGET_DIR:-target}/debug/sinter}")
STEPS=${STEPS:-12}
LIMIT_S=${LIMIT_S:-180}            # per launcher run
NODES=4
ID=$$
BR=stb${ID}br
NS=() VA=() VB=() ADDR=()
for i in $(seq 0 $((NODES - 1))); do
    NS+=("stb${ID}n$i")            # namespace
    VA+=("stb${ID}a$i")            # bridge end of its veth pair
    VB+=("stb${ID}b$i")            # namespace end
    ADDR+=("10.254.32.$((i + 1))")
done
PORT=29500
TMP=$(mktemp -d /tmp/sinter-netns.XXXXXX)
PIDS=()

skip() { echo "SKIP: $*"; exit 0; }
die() { echo "FAIL: $*" >&2; exit 1; }
ms() { echo $(($(date +%s%N) / 1000000)); }
in_ns() { local i=$1; shift; ip netns exec "${NS[$i]}" "$@"; }

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
ip link add "$BR" type bridge 2>/dev/null || skip "no bridge support"
ip link set "$BR" up
for i in $(seq 0 $((NODES - 1))); do
    [ "$i" = 0 ] || ip netns add "${NS[$i]}"
    ip link add "${VA[$i]}" type veth peer name "${VB[$i]}" 2>/dev/null || skip "no veth support"
    ip link set "${VB[$i]}" netns "${NS[$i]}"
    ip link set "${VA[$i]}" master "$BR" up
    in_ns "$i" ip link set lo up
    in_ns "$i" ip addr add "${ADDR[$i]}/24" dev "${VB[$i]}"
    in_ns "$i" ip link set "${VB[$i]}" up
done
# A link that does not carry ends a round at the collective timeout, naming the peer.
export SINTER_COLLECTIVE_TIMEOUT_S=${SINTER_COLLECTIVE_TIMEOUT_S:-5}

train=(train --quiet --model mlp --seed 3 --eval-batches 1 --eval-interval 1000)

# start N OUT [launch flags…] [-- train flags…]: one launcher per node in the background
# (PIDS), each node's output in OUT.nodeI.log.
start() {
    local n=$1 out=$2 launch_flags=() extra=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do launch_flags+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    extra=("$@")
    PIDS=()
    for i in $(seq 0 $((n - 1))); do
        in_ns "$i" timeout -s KILL "$LIMIT_S" "$BIN" launch --nproc-per-node 1 \
            --nnodes "$n" --node-rank "$i" --master-addr "${ADDR[0]}" --master-port "$PORT" \
            --grace-period 2 "${launch_flags[@]}" -- "${train[@]}" --batch-size "${BATCH:-16}" \
            --out "$out" "${extra[@]}" >"$out.node$i.log" 2>&1 &
        PIDS+=($!)
    done
}

# finish OUT: waits for every launcher of `start`; a failed node fails the script.
finish() {
    local out=$1 i=0
    for p in "${PIDS[@]}"; do
        wait "$p" || { cat "$out.node$i.log" >&2; die "node $i failed ($out)"; }
        i=$((i + 1))
    done
    PIDS=()
}

# nodes N OUT [train flags…]: a whole N-node run; prints its wall time in milliseconds.
nodes() {
    local n=$1 out=$2 t0
    shift 2
    t0=$(ms)
    start "$n" "$out" -- "$@"
    finish "$out"
    echo $(($(ms) - t0))
}

# busbw N MIB TAG: the host all-reduce's bus bandwidth between N nodes (GB/s, as nccl-tests
# count it), MIB MiB per rank, from rank 0's result line (`sinter bench allreduce --worker`
# is one rank of the benchmark, joining through the launcher's variables).
busbw() {
    local n=$1 mib=$2 tag=$3 i pids=()
    for i in $(seq 0 $((n - 1))); do
        in_ns "$i" timeout -s KILL "$LIMIT_S" "$BIN" launch --nproc-per-node 1 --nnodes "$n" \
            --node-rank "$i" --master-addr "${ADDR[0]}" --master-port "$PORT" --grace-period 2 \
            -- bench allreduce --worker --ranks "$n" --mb "$mib" --iters 5 \
            >"$TMP/$tag.node$i.log" 2>&1 &
        pids+=($!)
    done
    for i in $(seq 0 $((n - 1))); do
        wait "${pids[$i]}" || { cat "$TMP/$tag.node$i.log" >&2; die "all-reduce bench node $i failed ($tag)"; }
    done
    sed -n 's/.*SINTER_ALLREDUCE_RESULT //p' "$TMP/$tag.node0.log" \
        | python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["busbw_gbs"])'
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
    print(f"weights: the nodes = one process (worst relative L2 {worst:.1e})")
PY
}

# 1. Two and four nodes against one process with the same global batch.
for n in 2 4; do
    "$BIN" "${train[@]}" --steps "$STEPS" --checkpoint-interval "$STEPS" \
        --batch-size $((16 * n)) --out "$TMP/one$n" >"$TMP/one$n.log" 2>&1 \
        || { cat "$TMP/one$n.log" >&2; die "the one-process run (batch $((16 * n))) failed"; }
    t=$(nodes "$n" "$TMP/clean$n" --steps "$STEPS" --checkpoint-interval "$STEPS")
    check "$TMP/one$n" "$TMP/clean$n"
    echo "$n nodes, $STEPS MLP steps over the bridge: $t ms"
done

echo "host all-reduce over the bridge, 16 MiB per rank: 2 nodes $(busbw 2 16 ar2) GB/s," \
    "4 nodes $(busbw 4 16 ar4) GB/s bus bandwidth"

# 2. MPI across the namespaces: `mpirun` in node 0 starts one rank per node through an rsh
# agent that is `ip netns exec` (as ssh would reach a real machine), MPI's TCP transport on
# the bridge; DP under `--dist-backend auto` (MPI, since mpirun started it) must end with one
# process's weights, and MPI's all-reduce gets its bus bandwidth over the same link.
cat >"$TMP/netns-rsh" <<'AGENT'
#!/bin/sh
# Open MPI's rsh agent: "netns-rsh HOST COMMAND…" runs COMMAND in the namespace owning HOST.
host=$1; shift
exec ip netns exec "$(cat "$(dirname "$0")/ns.$host")" sh -c "$*"
AGENT
chmod +x "$TMP/netns-rsh"
for i in $(seq 0 $((NODES - 1))); do echo "${NS[$i]}" >"$TMP/ns.${ADDR[$i]}"; done
# mpi_run N ARGS…: `mpirun -n N sinter ARGS…` over nodes 0..N-1, bounded in time.
mpi_run() {
    local n=$1 hosts
    shift
    hosts=$(IFS=,; echo "${ADDR[*]:0:$n}")
    in_ns 0 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_mpi_yield_when_idle=1 SINTER_COLLECTIVE_TIMEOUT_S=60 \
        timeout -s KILL "$LIMIT_S" mpirun -n "$n" --host "$hosts" \
        --mca plm_rsh_agent "$TMP/netns-rsh" --mca oob_tcp_if_include 10.254.32.0/24 \
        --mca btl tcp,self --mca btl_tcp_if_include 10.254.32.0/24 "$BIN" "$@"
}
if ! command -v mpirun >/dev/null; then
    echo "SKIP (part): no mpirun (apt-get install openmpi-bin); MPI across nodes not tested"
elif ! "$BIN" info | grep -aq "mpi (built in"; then
    echo "SKIP (part): $BIN has no MPI backend (build with --features sinter/mpi); MPI across nodes not tested"
else
    t0=$(ms)
    # Not --quiet: rank 0 names the backend it chose.
    mpi_run 2 train "${train[@]:2}" --steps "$STEPS" --checkpoint-interval "$STEPS" --batch-size 16 \
        --out "$TMP/mpi2" >"$TMP/mpi2.log" 2>&1 || { cat "$TMP/mpi2.log" >&2; die "mpirun over 2 nodes failed"; }
    t=$(($(ms) - t0))
    grep -q "distributed backend: MPI" "$TMP/mpi2.log" || { cat "$TMP/mpi2.log" >&2; die "--dist-backend auto under mpirun did not use MPI"; }
    check "$TMP/one2" "$TMP/mpi2"
    echo "MPI across 2 nodes (mpirun, rsh agent = ip netns exec), $STEPS MLP steps: $t ms"
    bw=$(mpi_run 2 bench allreduce --worker --transport mpi --ranks 2 --mb 16 --iters 5 2>"$TMP/mpibw.log" \
        | sed -n 's/.*SINTER_ALLREDUCE_RESULT //p' \
        | python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["busbw_gbs"])') \
        || { cat "$TMP/mpibw.log" >&2; die "MPI all-reduce bench over 2 nodes failed"; }
    echo "MPI all-reduce over the bridge, 16 MiB per rank: 2 nodes $bw GB/s bus bandwidth"
fi

# 3. A lossy (and, with netem, slow) link.
L_STEPS=${L_STEPS:-100}
lossy() {
    for i in 0 1; do
        in_ns "$i" iptables -A INPUT -i "${VB[$i]}" -m statistic --mode random \
            --probability 0.01 -j DROP || return 1
    done
}
iptables=1
in_ns 0 iptables -L INPUT >/dev/null 2>&1 || iptables=0
if [ "$iptables" = 1 ]; then
    # The same run without loss again, timed under the same load as the lossy one.
    t_clean=$(nodes 2 "$TMP/clean2b" --steps "$L_STEPS" --checkpoint-interval "$L_STEPS")
    delay=""
    for i in 0 1; do
        in_ns "$i" tc qdisc add dev "${VB[$i]}" root netem delay 20ms 2>/dev/null && delay=" + netem delay 20ms"
    done
    lossy || die "iptables lists rules but cannot add the statistic match"
    t_lossy=$(nodes 2 "$TMP/lossy" --steps "$L_STEPS" --checkpoint-interval "$L_STEPS")
    check "$TMP/clean2b" "$TMP/lossy" exact
    echo "2 nodes, $L_STEPS MLP steps, 1 % packet loss$delay: $t_lossy ms vs $t_clean ms without" \
        "($(python3 -c "print(f'{$t_lossy / max($t_clean, 1):.1f}')")x), same weights bit for bit"
    echo "host all-reduce with 1 % loss$delay, 16 MiB per rank: 2 nodes $(busbw 2 16 arl) GB/s"
    for i in 0 1; do in_ns "$i" iptables -F INPUT; done
    for i in 0 1; do in_ns "$i" tc qdisc del dev "${VB[$i]}" root 2>/dev/null || true; done
    [ -n "$delay" ] || echo "SKIP (part): tc netem is unavailable here (no sch_netem in this kernel); delay not tested"
else
    echo "SKIP (part): iptables is unavailable here (apt-get install iptables); loss and partitions not tested"
fi

export P_STEPS=${P_STEPS:-300}
P_EVERY=20

# 4. A partition of node 3 after the first checkpoint, healed once the round has failed.
partition() {
    cut() { in_ns 3 iptables -A INPUT -i "${VB[3]}" -j DROP; in_ns 3 iptables -A OUTPUT -o "${VB[3]}" -j DROP; }
    heal() { in_ns 3 iptables -F INPUT; in_ns 3 iptables -F OUTPUT; }
    t_ref=$(nodes 4 "$TMP/ref4" --steps "$P_STEPS" --checkpoint-interval "$P_EVERY")
    start 4 "$TMP/part" --max-restarts 1 --rdzv-timeout 60 -- --steps "$P_STEPS" \
        --checkpoint-interval "$P_EVERY"
    t0=$(ms)
    until [ -e "$TMP/part/checkpoint.safetensors" ]; do
        [ $(($(ms) - t0)) -lt $((LIMIT_S * 1000)) ] || die "no checkpoint within $LIMIT_S s"
        sleep 0.05
    done
    cut
    t_cut=$(ms)
    until grep -q "restarting the group" "$TMP/part.node0.log"; do
        [ $(($(ms) - t_cut)) -lt 60000 ] || { cat "$TMP/part.node0.log" >&2; heal; die "node 0 did not notice the partition within 60 s"; }
        sleep 0.05
    done
    t_failed=$(ms)
    heal
    finish "$TMP/part"
    timeouts=$(cat "$TMP"/part.node*.log | grep -c "timed out after" || true)
    [ "$timeouts" -gt 0 ] || { cat "$TMP"/part.node*.log >&2; die "no rank named the collective that timed out"; }
    echo "partition of node 3 after step $P_EVERY: node 0's launcher restarted the group" \
        "$(((t_failed - t_cut))) ms after the cut (collective timeout ${SINTER_COLLECTIVE_TIMEOUT_S} s); for example:"
    grep -h "timed out after" "$TMP"/part.node*.log | sed 's/^/    /' | head -4
    check "$TMP/ref4" "$TMP/part" exact
    echo "healed and restarted from the last checkpoint: the weights equal the undisturbed 4-node run's (${t_ref} ms) bit for bit"
}
# (Part 5 needs no iptables, so it runs either way.)
if [ "$iptables" = 1 ]; then partition; fi

# 5. A node's launcher killed (SIGKILL, as when its machine dies) after the first checkpoint:
# its rank dies with it, nothing is left in its namespace, and with `--min-nodes 3` the other
# three launchers restart the group without it, from the checkpoint, at world size 3 (the
# global batch of 48 then splits 16 per rank instead of 12).
BATCH=12 start 4 "$TMP/kill" --max-restarts 1 --min-nodes 3 --max-nodes 4 --rdzv-last-call 1 \
    --rdzv-timeout 60 -- --steps "$P_STEPS" --checkpoint-interval "$P_EVERY"
t0=$(ms)
until [ -e "$TMP/kill/checkpoint.safetensors" ]; do
    [ $(($(ms) - t0)) -lt $((LIMIT_S * 1000)) ] || die "no checkpoint within $LIMIT_S s"
    sleep 0.05
done
# in_ns_cmds I: "PID ARGS" of every process in node I's namespace.
in_ns_cmds() {
    local p
    for p in $(ip netns pids "${NS[$1]}"); do
        echo "$p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
    done
}
launcher=$(in_ns_cmds 3 | awk -v b="$BIN" '$2 == b && $3 == "launch" { print $1 }')
[ -n "$launcher" ] || { in_ns_cmds 3 >&2; die "node 3's launcher is not running"; }
kill -KILL $launcher
t_kill=$(ms)
until [ -z "$(ip netns pids "${NS[3]}")" ]; do
    [ $(($(ms) - t_kill)) -lt 10000 ] || { in_ns_cmds 3 >&2; die "processes left in node 3's namespace 10 s after its launcher was killed"; }
    sleep 0.05
done
t_gone=$(ms)
wait "${PIDS[3]}" 2>/dev/null || true
PIDS=("${PIDS[@]:0:3}")
finish "$TMP/kill"
python3 - "$TMP/kill/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["world_size"] == 3, f"world size {s['world_size']} after the restart, want 3"
assert s["steps"] == int(__import__("os").environ.get("P_STEPS", "300")), s["steps"]
assert s.get("resumed_from_step") is not None, "the restart did not resume from the checkpoint"
print(f"    resumed from step {s['resumed_from_step']} at world size 3, ran to step {s['steps']}")
PY
grep -q "restart 1 of 1" "$TMP/kill.node0.log" || { cat "$TMP/kill.node0.log" >&2; die "node 0's launcher did not restart the group"; }
echo "node 3's launcher killed after the first checkpoint: its namespace empty $((t_gone - t_kill)) ms later;" \
    "nodes 0-2 restarted the group at world size 3 and finished"
echo "PASS"
