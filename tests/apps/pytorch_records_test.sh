#!/usr/bin/env bash
# apps/bench/pytorch_records.py on a small LSTM and a small GPT over a corpus of records of many
# lengths. compare: troupe (one stage, sync) and PyTorch (padded, and packed for the LSTM), from
# the same initial weights on the same batches, give every step's loss and the validation loss
# within 1e-4 relative, troupe on unpadded and on padded keys alike (which also shows that the
# two read the same records in the same order, and that the GPT attends within each record from
# position 0). speed --quick on the LSTM: one round of each configuration, each with a positive
# real-token rate and a validation loss, the ratios and the issue's bars named. Skips (exit 77)
# where no Python with PyTorch is installed.
# Usage: pytorch_records_test.sh BUILD_DIR
set -euo pipefail
build="$1"
source="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python=""
for candidate in /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
    python="$candidate"
    break
  fi
done
[ -n "$python" ] || { echo "pytorch_records_test.sh: no python3 with torch; skipped"; exit 77; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Records of 5 to 60 bytes between lines holding only "%", as fortune's files are.
mkdir "$scratch/records"
for i in $(seq 1 120); do
  for j in $(seq 0 $(((i * 7) % 5))); do printf 'fox %d jumps %d; ' "$i" "$j"; done
  printf '\n%%\n'
done >"$scratch/records/fortunes"
cat >"$scratch/lstm.toml" <<JOB
[[model.nodes]]
name = "embed"
layers = [{ type = "embedding", vocab = 256, dim = 8 }]
next = "cell"
[[model.nodes]]
name = "cell"
layers = [{ type = "lstm_cell", out = 16 }]
route = "loop"
emit = "every"
next = "head"
[[model.nodes]]
name = "head"
layers = [{ type = "linear", out = 256 }]
[data]
dataset = "text-records"
path = "$scratch/records"
context = 24
validation_fraction = 0.1
[parallelism]
stages = 2
mode = "async"
max_active_keys = 2
min_update_interval = 1
[training]
batch_size = 4
epochs = 1
optimizer = "adam"
lr = 1e-2
clip_norm = 1.0
seed = 1
JOB
# The GPT: two nodes of transformer blocks, records longer than the context cut into pieces.
cat >"$scratch/gpt.toml" <<JOB
[[model.nodes]]
name = "embed"
layers = [{ type = "embedding", vocab = 256, dim = 16, positions = 24 },
          { type = "transformer_block", heads = 2 }]
next = "top"
[[model.nodes]]
name = "top"
layers = [{ type = "transformer_block", heads = 2 }, { type = "layernorm" },
          { type = "lm_head", vocab = 256 }]
[data]
dataset = "text-records"
path = "$scratch/records"
context = 24
validation_fraction = 0.1
[parallelism]
stages = 2
mode = "async"
[training]
batch_size = 4
epochs = 1
optimizer = "adamw"
lr = 1e-2
clip_norm = 1.0
seed = 1
JOB
bench="$source/apps/bench/pytorch_records.py"
for job in lstm gpt; do
  for padding in none longest; do
    output="$("$python" "$bench" compare "$scratch/$job.toml" --troupe "$build/apps/troupe" \
      --steps 8 --padding "$padding" --pytorch-setting threads=1)" || { echo "$output"; exit 1; }
    echo "$output"
    grep -q ": PASS$" <<<"$output"
  done
done
# PyTorch's setting is given (its probe starts a process per candidate); troupe's is probed.
output="$("$python" "$bench" speed "$scratch/lstm.toml" --troupe "$build/apps/troupe" --quick \
  --pytorch-setting threads=1)" || { echo "$output"; exit 1; }
echo "$output"
for name in "pytorch padded\+packed" "troupe 2 stages async" "troupe 2 stages async padded" \
  "troupe 1 stage sync" "troupe 1 stage sync padded"; do
  grep -qE "^$name +[1-9][0-9]* +[0-9]+\.[0-9]+$" <<<"$output" ||
    { echo "no real tokens/s and validation loss for '$name'"; exit 1; }
done
grep -qE "^  troupe 1 stage sync padded \(tuned: .+\)" <<<"$output"
grep -qE "troupe unpadded \(.+\) / troupe padded \(.+\) +[0-9.]+ +bar >= 1.3: (met|NOT met)" <<<"$output"
grep -qE "troupe unpadded \(.+\) / pytorch padded\+packed +[0-9.]+ +bar >= 1.0: (met|NOT met)" <<<"$output"
tail -n 1 <<<"$output" | "$python" -c "import json, sys; json.loads(sys.stdin.read())"
