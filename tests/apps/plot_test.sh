#!/usr/bin/env bash
# Trains two short runs of the Fashion-MNIST MLP (sync, and async with a trace), draws them with
# `troupe plot` and checks every figure as PNG and SVG, and that bad run directories and
# metrics lines are reported with status 2 and their names. Usage: plot_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
troupe="$build/apps/troupe"
source="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
fail() { echo "plot_test.sh: $*"; exit 1; }

# 40 steps each, a loss line every 5 and a test evaluation every 20: a few seconds per run.
short=(--set training.max_steps=40 --set training.eval_interval_steps=20
       --set metrics.log_interval=5 --quiet)
"$troupe" train "$source/apps/examples/fashion_mlp_sync.toml" "${short[@]}" \
  --out "$scratch/sync" >"$scratch/sync.log" 2>&1 ||
  { cat "$scratch/sync.log"; fail "the sync run failed"; }
"$troupe" train "$source/apps/examples/fashion_mlp_async.toml" "${short[@]}" --set metrics.trace=true \
  --out "$scratch/async" >"$scratch/async.log" 2>&1 ||
  { cat "$scratch/async.log"; fail "the async run failed"; }

"$troupe" plot "$scratch/sync" "$scratch/async" --out "$scratch/figures" 2>&1 ||
  fail "troupe plot failed with status $?"
python3 - "$scratch/figures" <<'EOF' || fail "the figures are not all there"
import os, sys, xml.etree.ElementTree as tree
out = sys.argv[1]
names = ["loss_vs_steps", "loss_vs_time", "accuracy_vs_steps", "accuracy_vs_time",
         "throughput", "gantt", "staleness"]
bad = []
for name in names:
    png, svg = os.path.join(out, name + ".png"), os.path.join(out, name + ".svg")
    if not os.path.isfile(png) or os.path.getsize(png) < 100:
        bad.append(png + " is missing or empty")
    else:
        with open(png, "rb") as file:
            if file.read(8) != b"\x89PNG\r\n\x1a\n":
                bad.append(png + " is not a PNG")
    try:
        root = tree.parse(svg).getroot()
        if root.tag != "{http://www.w3.org/2000/svg}svg":
            bad.append("%s has the root <%s>, not <svg>" % (svg, root.tag))
    except (OSError, tree.ParseError) as error:
        bad.append("%s: %s" % (svg, error))
for problem in bad:
    print(problem)
print("plot_test.sh: %d figures checked as PNG and SVG" % len(names))
sys.exit(1 if bad else 0)
EOF

# Labels and a window of the trace.
"$troupe" plot "$scratch/sync" "$scratch/async" --label GPipe --label AMPNet --window 0:1 \
  --out "$scratch/labelled" >/dev/null 2>&1 || fail "troupe plot with --label and --window failed"
grep -q AMPNet "$scratch/labelled/loss_vs_steps.svg" || fail "the label AMPNet is not in the SVG"

# expect_error STATUS TEXT ARGS...: troupe plot ARGS exits with STATUS and says TEXT.
expect_error() {
  local expected="$1" text="$2" status=0
  shift 2
  "$troupe" plot "$@" >"$scratch/error.log" 2>&1 || status=$?
  [ "$status" -eq "$expected" ] ||
    { cat "$scratch/error.log"; fail "troupe plot $* exited with $status, not $expected"; }
  grep -qF -- "$text" "$scratch/error.log" ||
    { cat "$scratch/error.log"; fail "troupe plot $* did not say \"$text\""; }
  echo "plot_test.sh: troupe plot $* -> $status: $(cat "$scratch/error.log")"
}
mkdir -p "$scratch/not-a-run" "$scratch/broken"
expect_error 2 "$scratch/not-a-run" "$scratch/sync" "$scratch/not-a-run" --out "$scratch/x"
expect_error 2 "$scratch/missing-run" "$scratch/missing-run" --out "$scratch/x"
head -n 3 "$scratch/sync/metrics.jsonl" >"$scratch/broken/metrics.jsonl"
echo '{"step": 5, "loss": ' >>"$scratch/broken/metrics.jsonl"
echo '{"step": 10, "loss": 1.0, "wall_s": 1}' >>"$scratch/broken/metrics.jsonl"
expect_error 2 "metrics.jsonl line 4" "$scratch/broken" --out "$scratch/x"
expect_error 2 "--label" "$scratch/sync" "$scratch/async" --label one --out "$scratch/x"
echo "plot_test.sh: troupe plot drew a sync and an async run and reported bad input"
