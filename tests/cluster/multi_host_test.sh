#!/usr/bin/env bash
# Multi-host test: the coordinator and two workers each in their own network namespace (a
# host with its own address), joined by veth pairs to a bridge, talking tcp with CURVE on.
# The run must end exactly where the in-process run of the same sync job ends. Needs root
# and iproute2; exits 77 (skipped) without them.
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

coordinator="tcp://$subnet.1:29500"
ip netns exec "tr${tag}c" "$troupe" coordinator "$work/job.toml" --listen "$coordinator" \
  --workers 2 --keys "$work/keys" --key-name coordinator --quiet --out "$work/cluster" \
  >"$work/coordinator.log" 2>&1 &
coordinator_pid=$!
for i in 1 2; do
  ip netns exec "tr${tag}w$i" "$troupe" worker --coordinator "$coordinator" \
    --listen "tcp://$subnet.$((i + 1)):*" --keys "$work/keys" --key-name "w$i" \
    >"$work/worker$i.log" 2>&1 &
done
if ! wait "$coordinator_pid"; then
  echo "coordinator failed:"; cat "$work/coordinator.log" "$work"/worker*.log
  exit 1
fi
expected=$(grep -o '"final_test_loss": [^,]*' "$work/local/summary.json")
actual=$(grep -o '"final_test_loss": [^,]*' "$work/cluster/summary.json")
echo "in-process: $expected; three hosts over tcp with CURVE: $actual"
[ "$expected" = "$actual" ]
