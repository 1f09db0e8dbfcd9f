#!/usr/bin/env bash
# What watching a run costs it: trains the same job in alternating rounds without any
# monitoring (no dashboard, metrics.stall_timeout_s = 0) and with the dashboard on and a client
# polling every endpoint each second (as the open page does), and prints each round's samples/s,
# the medians and their ratio.
#
#   bash apps/bench/dashboard_overhead.sh [BUILD_DIR] [ROUNDS] [JOB] [--set KEY=VALUE ...]
#
# Defaults: build, 5 rounds, the Fashion-MNIST MLP in a 2-stage async pipeline for one epoch.
set -euo pipefail
build=${1:-build}
rounds=${2:-5}
job=${3:-apps/examples/fashion_mlp_async.toml}
shift $(( $# < 3 ? $# : 3 ))
overrides=("$@")
[ ${#overrides[@]} -gt 0 ] || overrides=(--set training.epochs=1 --set parallelism.stages=2)
troupe="$build/apps/troupe"
[ -x "$troupe" ] || { echo "no $troupe: build it first" >&2; exit 2; }
work=$(mktemp -d)
poller=0
trap '[ "$poller" != 0 ] && kill "$poller" 2>/dev/null; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rate_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_s"])' "$1/summary.json"; }

# Polls the endpoints each second over one kept-alive connection, with since= as the page keeps
# it, until killed: one process started once, so that the client costs the machine little.
poll() {
  exec python3 - "$1" <<'POLL'
import http.client, json, sys, time
port = int(sys.argv[1])
since, trace = 0, 0
connection = None
while True:
    try:
        connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        for path in ("/api/summary", f"/api/metrics?since={since}", "/api/stages",
                     f"/api/trace?since={trace}"):
            connection.request("GET", path)
            body = json.loads(connection.getresponse().read())
            if path.startswith("/api/metrics"):
                since = body["next"]
            elif path.startswith("/api/trace"):
                trace = body["next"]
    except (OSError, http.client.HTTPException, ValueError):
        connection = None
    time.sleep(1)
POLL
}

plain=() watched=()
for round in $(seq 1 "$rounds"); do
  # ABBA order: neither variant always runs first (the machine warms, other load comes and goes).
  order="plain watched"
  [ $((round % 2)) = 0 ] && order="watched plain"
  for variant in $order; do
    out="$work/$variant-$round"
    if [ "$variant" = plain ]; then
      "$troupe" train "$job" "${overrides[@]}" --set metrics.stall_timeout_s=0 --out "$out" \
        --quiet > /dev/null 2>&1
      plain+=("$(rate_of "$out")")
    else
      port=$(free_port)
      poll "$port" & poller=$!
      "$troupe" train "$job" "${overrides[@]}" --dashboard "127.0.0.1:$port" --out "$out" \
        --quiet > /dev/null 2>&1
      kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null || true; poller=0
      watched+=("$(rate_of "$out")")
    fi
  done
  printf 'round %d: %10.0f samples/s plain  %10.0f samples/s with the dashboard\n' \
    "$round" "${plain[-1]}" "${watched[-1]}"
done
python3 - "${plain[*]}" "${watched[*]}" <<'EOF'
import statistics, sys
plain = [float(x) for x in sys.argv[1].split()]
watched = [float(x) for x in sys.argv[2].split()]
a, b = statistics.median(plain), statistics.median(watched)
print(f"median: {a:.0f} samples/s plain, {b:.0f} with the dashboard: "
      f"{b / a:.3f}x ({(1 - b / a) * 100:+.1f} % cost)")
EOF
