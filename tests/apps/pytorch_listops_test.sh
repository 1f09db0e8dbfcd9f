#!/usr/bin/env bash
# apps/bench/pytorch_listops.py on a few hundred expressions. compare: PyTorch's Tree-LSTM from
# troupe's initial weights gives troupe's loss at every step, within 1e-4, with one Tree-LSTM
# layer and with two. check: the recursive and the level-batched implementations give the same
# loss and gradients. race --quick:
# PyTorch (the faster implementation, named) trains one epoch on the expressions `troupe
# dataset` writes, then every troupe setting races to its accuracy, and the table gives each a
# time, an accuracy and both ratios, and says whether each bar is met. Skips (exit 77) where no
# Python with PyTorch is installed.
# Usage: pytorch_listops_test.sh BUILD_DIR
set -euo pipefail
build="$1"
source="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python=""
for candidate in /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch, numpy" 2>/dev/null; then
    python="$candidate"
    break
  fi
done
[ -n "$python" ] || { echo "pytorch_listops_test.sh: no python3 with torch; skipped"; exit 77; }
script="$source/apps/bench/pytorch_listops.py"
output="$("$python" -B "$script" compare --quick --steps 8 --troupe "$build/apps/troupe")" || { echo "$output"; exit 1; }
echo "$output"
grep -q "over 8 steps (tolerance 0.0001): PASS$" <<<"$output"
output="$("$python" -B "$script" check --quick --troupe "$build/apps/troupe")" || { echo "$output"; exit 1; }
echo "$output"
grep -q ": PASS$" <<<"$output"
# Two Tree-LSTM layers, one per stage: the same per-step losses, both implementations alike.
stacked="$source/apps/examples/listops_stacked_tree_lstm.toml"
output="$("$python" -B "$script" compare --quick --steps 8 --job "$stacked" --troupe "$build/apps/troupe")" || { echo "$output"; exit 1; }
echo "$output"
grep -q "over 8 steps (tolerance 0.0001): PASS$" <<<"$output"
output="$("$python" -B "$script" check --quick --job "$stacked" --troupe "$build/apps/troupe")" || { echo "$output"; exit 1; }
echo "$output"
grep -q ": PASS$" <<<"$output"
output="$("$python" -B "$script" race --quick --troupe "$build/apps/troupe" \
  --pytorch-setting threads=1 --troupe-setting threads=1)" || { echo "$output"; exit 1; }
echo "$output"
grep -qE "^wrote 256 training and 64 test instances of listops data" <<<"$output"
grep -qE "^pytorch: the (recursive|batched) implementation is faster \(recursive [0-9.]+ instances/s, batched [0-9.]+ instances/s\)$" <<<"$output" \
  || { echo "no implementation chosen"; exit 1; }
grep -qE "^  pytorch: accuracy A = 0\.[0-9]+ in T = [0-9.]+ s$" <<<"$output" || { echo "no PyTorch run"; exit 1; }
for name in async-2-stages sync-1-stage sync-2-stages-m1 sync-2-stages-m2 sync-2-stages-m4; do
  grep -qE "^$name +[01]/1 +([0-9.]+ s|not reached) +0\.[0-9]+ +([0-9.]+x|-) +([0-9.]+x|-)" <<<"$output" \
    || { echo "no row for $name"; exit 1; }
done
grep -qE "^bar: async-2-stages time to A <= 0.7x PyTorch's T: (met|NOT met)" <<<"$output"
grep -qE "^bar: async-2-stages time to A <= 0.8x the best sync setting" <<<"$output"
# The JSON line: every setting, its final accuracy that of a real evaluation on 64 expressions.
tail -n 1 <<<"$output" | "$python" -c '
import json, sys
report = json.loads(sys.stdin.read())
assert report["epochs"] == 1 and report["rounds"] == 1, report
assert len(report["troupe"]) == 5, report["troupe"].keys()
for name, row in report["troupe"].items():
    assert abs(row["final_accuracy"] * 64 - round(row["final_accuracy"] * 64)) < 1e-9, (name, row)
assert 0 < report["pytorch_wall_s"] and isinstance(report["bars_met"], bool), report
'
