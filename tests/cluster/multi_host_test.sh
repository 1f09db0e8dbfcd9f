#!/usr/bin/env bash
# Multi-host test: the coordinator and two workers each in their own network namespace (a
# host with its own address), joined by veth pairs to a bridge, talking tcp with CURVE on.
# The run must end exactly where the in-process run of the same sync job ends; then the same
# with two replicas of a 2-stage pipeline (a worker per replica, the gradients' ring all-reduce
# between the hosts), which must also end where one pipeline at the same global batch ends, to
# float rounding. Needs root and iproute2; exits 77 (skipped) without them.
set -euo pipefail
troupe=$1
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
  echo "skipped: needs root and iproute2"
  exit 77
fi
tag=$(( $$ % 10000 ))
subnet="10.213.$(( $$ % 250 ))"
bridge="trb$tag"
work=$(mktemp -d)
hosts=(c w1 w2)
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  for host in "${hosts[@]}"; do ip netns del "tr$tag$host" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip link add "$bridge" type bridge
ip link set "$bridge" up
for i in "${!hosts[@]}"; do
  host=${hosts[$i]}
  ns="tr$tag$host"
  ip netns add "$ns"
  ip link add "v$tag$host" type veth peer name "p$tag$host"
  ip link set "p$tag$host" netns "$ns"
  ip link set "v$tag$host" master "$bridge" up
  ip netns exec "$ns" ip addr add "$subnet.$((i + 1))/24" dev "p$tag$host"
  ip netns exec "$ns" ip link set "p$tag$host" up
  ip netns exec "$ns" ip link set lo up
done

cp "$(dirname "$0")/three_stage_job.toml" "$work/job.toml"

for name in coordinator w1 w2; do "$troupe" keygen "$work/keys" --name "$name" >/dev/null; done
"$troupe" train "$work/job.toml" --quiet --out "$work/local" >/dev/null 2>&1

# Runs the job on the three hosts with the overrides given; the output goes to $work/$1.
run_cluster() {
  local out=$1 port=$2
  shift 2
  local coordinator="tcp://$subnet.1:$port"
  ip netns exec "tr${tag}c" "$troupe" coordinator "$work/job.toml" "$@" --listen "$coordinator" \
    --workers 2 --keys "$work/keys" --key-name coordinator --quiet --out "$work/$out" \
    >"$work/$out.log" 2>&1 &
  local coordinator_pid=$!
  for i in 1 2; do
    ip netns exec "tr${tag}w$i" "$troupe" worker --coordinator "$coordinator" \
      --listen "tcp://$subnet.$((i + 1)):*" --keys "$work/keys" --key-name "w$i" \
      >"$work/$out-worker$i.log" 2>&1 &
  done
  if ! wait "$coordinator_pid"; then
    echo "coordinator failed:"; cat "$work/$out.log" "$work/$out"-worker*.log
    exit 1
  fi
}
loss() { grep -o '"final_test_loss": [^,]*' "$work/$1/summary.json"; }

run_cluster cluster 29500
expected=$(loss local)
actual=$(loss cluster)
echo "in-process: $expected; three hosts over tcp with CURVE: $actual"
[ "$expected" = "$actual" ]

replicas=(--set parallelism.stages=2 --set parallelism.replicas=2 --set parallelism.micro_batches=2)
"$troupe" train "$work/job.toml" --quiet --out "$work/one" --set parallelism.stages=2 \
  --set parallelism.micro_batches=4 >/dev/null 2>&1
"$troupe" train "$work/job.toml" --quiet --out "$work/replicas-local" "${replicas[@]}" \
  >/dev/null 2>&1
run_cluster replicas 29501 "${replicas[@]}"
one=$(loss one | grep -o '[0-9.e+-]*$')
local_replicas=$(loss replicas-local)
cluster_replicas=$(loss replicas)
echo "one 2-stage pipeline: $one; 2 replicas in-process: $local_replicas; 2 replicas on" \
  "two hosts: $cluster_replicas"
[ "$local_replicas" = "$cluster_replicas" ]
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(b))" \
  "$(echo "$cluster_replicas" | grep -o '[0-9.e+-]*$')" "$one"
