#!/usr/bin/env bash
# apps/bench/pytorch_gpt.py compare and speed on a small GPT. compare: troupe (2 stages, sync,
# 2 micro-batches, AdamW, global gradient clipping) and PyTorch, from the same initial weights
# on the same batches, must give every step's loss within 1e-4 relative. speed must time each
# side after a short probe of its settings, and name the setting chosen (or given). Skips
# (exit 77) where no Python with PyTorch is installed.
# Usage: pytorch_gpt_test.sh BUILD_DIR
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
[ -n "$python" ] || { echo "pytorch_gpt_test.sh: no python3 with torch; skipped"; exit 77; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# A corpus of its own, so the test needs no installed text.
for i in $(seq 1 300); do echo "Line $i: the quick brown fox jumps over the lazy dog; naïve café."; done >"$scratch/corpus.txt"
cat >"$scratch/gpt.toml" <<JOB
[model]
layers = [
  { type = "embedding", vocab = 256, dim = 32 },
  { type = "transformer_block", heads = 4 },
  { type = "transformer_block", heads = 4 },
  { type = "layernorm" },
  { type = "lm_head", vocab = 256 },
]
[data]
dataset = "text"
path = "$scratch/corpus.txt"
context = 16
[parallelism]
stages = 2
micro_batches = 2
[training]
batch_size = 8
optimizer = "adamw"
lr = 3e-3
weight_decay = 0.1
clip_norm = 0.5
lr_schedule = "cosine"
warmup_steps = 5
JOB
output="$("$python" "$source/apps/bench/pytorch_gpt.py" compare "$scratch/gpt.toml" \
  --troupe "$build/apps/troupe" --steps 30 --tolerance 1e-4)" || { echo "$output"; exit 1; }
echo "$output"
grep -q ": PASS$" <<<"$output"
# speed: both sides timed over the same steps after the same warm-up; troupe's rate comes from
# its per-step metrics records, so a run that logged too few steps would fail here. Each side
# first probes its settings (briefly here) and names the one it chose.
output="$("$python" "$source/apps/bench/pytorch_gpt.py" speed "$scratch/gpt.toml" \
  --troupe "$build/apps/troupe" --rounds 1 --steps 4 --pipelines 2:async:2 \
  --probe-seconds 0.05 --probe-rounds 1)" || { echo "$output"; exit 1; }
echo "$output"
grep -q "after 3 warm-up steps" <<<"$output"
for name in pytorch "troupe 1 stage" "troupe 2 stages async M=2"; do
  grep -qE "^$name +[1-9][0-9]* +[0-9.]+$" <<<"$output" || { echo "no positive tokens/s for '$name'"; exit 1; }
  grep -qE "^  $name \(tuned: .+\)" <<<"$output" || { echo "no tuned setting for '$name'"; exit 1; }
done
grep -qE "default settings [0-9.]+ \([0-9.]+x\)" <<<"$output" || { echo "no default rate"; exit 1; }
# A setting given skips the probe and is named as given.
output="$("$python" "$source/apps/bench/pytorch_gpt.py" speed "$scratch/gpt.toml" \
  --troupe "$build/apps/troupe" --rounds 1 --steps 4 --pipelines \
  --pytorch-setting OMP_WAIT_POLICY=PASSIVE,threads=1 --troupe-setting threads=1)" || { echo "$output"; exit 1; }
echo "$output"
grep -q "probing" <<<"$output" && { echo "probed although both settings were given"; exit 1; }
grep -q "pytorch (given: OMP_WAIT_POLICY=PASSIVE, threads 1)" <<<"$output"
grep -q "troupe 1 stage (given: threads 1)" <<<"$output"
