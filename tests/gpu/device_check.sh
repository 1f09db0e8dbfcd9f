#!/usr/bin/env bash
# The GPU device check: run on the GPU machine from a device bundle (tests/gpu/bundle.sh), it
# checks and measures troupe there in one call of under 9 minutes, and writes to $OUT (7 files):
#   nvidia-smi.txt                  the head of `nvidia-smi -q`
#   gpu-tests-layers.xml, gpu-tests-actors.xml
#                                   the GPU tests (backend parity, CUDA pipeline exactness,
#                                   precision tolerances), as gtest XML
#   memcheck.txt                    compute-sanitizer memcheck over a 20-step 2-stage CUDA run
#   bench.log                       `troupe bench compute --device cuda` at fp32, tf32 and bf16,
#                                   each between two runs of apps/bench/pytorch_mlp.py on the
#                                   same model, batch and precision; the GPT example against
#                                   PyTorch (apps/bench/pytorch_gpt.py compare and speed);
#                                   `troupe bench pipeline`
#   device-check.log                every step's command and output
#   summary.json                    every figure, the ratios against PyTorch and cuBLAS, and the
#                                   GPU bars as met, missed or not measured
# Without a GPU it runs to its end, reports every GPU step as skipped and still writes
# summary.json. Exit status: 0 when no step failed, 1 otherwise, 2 on bad usage.
# Usage: OUT=DIR tests/gpu/device_check.sh [BUNDLE]
#   BUNDLE defaults to $TROUPE_BUNDLE, then device-bundle/ in the repository, then the bundle
#   that tests/gpu/bundle.sh made last (build/last-device-bundle).
set -uo pipefail
repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle="${1:-${TROUPE_BUNDLE:-}}"
if [ -z "$bundle" ] && [ -x "$repository/device-bundle/run.sh" ]; then bundle="$repository/device-bundle"; fi
if [ -z "$bundle" ] && [ -f "$repository/build/last-device-bundle" ]; then bundle="$(cat "$repository/build/last-device-bundle")"; fi
if [ -z "$bundle" ] || [ ! -x "$bundle/run.sh" ]; then
  echo "device_check.sh: no device bundle${bundle:+ at '$bundle'}; make one with tests/gpu/bundle.sh DIR" >&2
  exit 2
fi
if [ -z "${OUT:-}" ]; then
  echo "device_check.sh: set OUT to the directory for the results" >&2
  exit 2
fi
bundle="$(cd "$bundle" && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
run="$bundle/run.sh"
log="$OUT/device-check.log"
: >"$log"
: >"$OUT/bench.log"
started=$(date +%s)
budget_s="${TROUPE_CHECK_SECONDS:-520}"

note() { echo "device_check.sh: $*" | tee -a "$log"; }
record() {  # record NAME STATUS SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$work/steps.tsv"
  note "$1: $2 ($3 s) $4"
}
remaining() { echo $((budget_s - ($(date +%s) - started))); }
# timed LIMIT_S COMMAND...: runs it under a time limit, its output to the log; sets $rc, $took.
timed() {
  local limit="$1" begin tenths
  shift
  [ "$limit" -ge 10 ] || limit=10
  begin=$(date +%s%N)
  echo "+ $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  tenths=$((($(date +%s%N) - begin) / 100000000))
  took="$((tenths / 10)).$((tenths % 10))"
}

gpu=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu=yes; fi
cuda_built=no
grep -q '"cuda": true' "$bundle/manifest.json" && cuda_built=yes
note "bundle $bundle (CUDA backend: $cuda_built), GPU: $gpu, results in $OUT"
skip_reason=""
[ "$gpu" = yes ] || skip_reason="no GPU (nvidia-smi is missing or lists none)"
[ -n "$skip_reason" ] || [ "$cuda_built" = yes ] || skip_reason="the bundle was built without CUDA"

# 1. The GPU's identity.
if [ "$gpu" = yes ]; then
  nvidia-smi -q 2>&1 | head -n 80 >"$OUT/nvidia-smi.txt"
  record nvidia_smi passed 0 "$(sed -n 's/ *Product Name *: //p' "$OUT/nvidia-smi.txt" | head -1)"
else
  record nvidia_smi skipped 0 "no GPU (nvidia-smi is missing or lists none)"
fi

# 2. The GPU tests; without a GPU they skip themselves, which proves the bundled executables run.
test_step() {  # test_step NAME PROGRAM FILTER XML
  timed "$(($(remaining) / 3))" "$run" "$2" --gtest_filter="$3" --gtest_output="xml:$4"
  local counts
  counts="$(grep -c '<testcase ' "$4" 2>/dev/null) tests, $(grep -c '<failure ' "$4" 2>/dev/null) failed, $(grep -c '<skipped ' "$4" 2>/dev/null) skipped"
  if [ "$rc" -ne 0 ] || [ ! -s "$4" ]; then
    record "$1" failed "$took" "exit status $rc: $counts"
  elif [ -n "$skip_reason" ]; then
    record "$1" skipped "$took" "$skip_reason: $counts"
  else
    record "$1" passed "$took" "$counts"
  fi
}
test_step gpu_tests_layers troupe_layers_tests 'CudaBackendTest.*:CudaParityTest.*:GemmPrecisionTest.*:DeviceGroupTest.*' "$OUT/gpu-tests-layers.xml"
test_step gpu_tests_actors troupe_actors_tests '*Cuda*:*Gpu*:*ReducedPrecision*:*Nccl*' "$OUT/gpu-tests-actors.xml"

# 3. compute-sanitizer over a short 2-stage training run on the GPU.
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
if [ -n "$skip_reason" ]; then
  record memcheck skipped 0 "$skip_reason"
elif [ -z "$sanitizer" ]; then
  record memcheck failed 0 "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
else
  timed "$(($(remaining) / 2))" "$run" "$sanitizer" --tool memcheck --leak-check no --error-exitcode 3 \
    --log-file "$OUT/memcheck.txt" "$bundle/bin/troupe" train "$bundle/apps/examples/fashion_mlp.toml" \
    --set parallelism.devices=cuda --set parallelism.stages=2 --set training.max_steps=20 \
    --set data.test_samples=512 --set "data.path=\"$bundle/data/fashion-mnist\"" --out "$work/memcheck-run" --quiet
  errors="$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$OUT/memcheck.txt" | tail -1)"
  if [ "$rc" -eq 0 ] && [ "${errors:-x}" = 0 ]; then
    record memcheck passed "$took" "0 errors over 20 steps, 2 stages on cuda"
  else
    record memcheck failed "$took" "exit status $rc, errors: ${errors:-unknown}"
  fi
fi

# 4. GEMMs against cuBLAS's best and end-to-end training against PyTorch eager, per precision:
#    PyTorch, troupe, PyTorch again, so that a drifting GPU touches both alike.
pytorch_ready=no
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1 && pytorch_ready=yes
for precision in fp32 tf32 bf16; do
  if [ -n "$skip_reason" ]; then
    record "bench_compute_$precision" skipped 0 "$skip_reason"
    record "pytorch_$precision" skipped 0 "$skip_reason"
    continue
  fi
  pytorch() {
    if [ "$pytorch_ready" = yes ]; then
      local before
      before=$(wc -l <"$log")
      timed 90 python3 "$bundle/apps/bench/pytorch_mlp.py" --precision "$precision"
      tail -n +$((before + 1)) "$log" | grep '^pytorch_mlp ' | tee -a "$OUT/bench.log" >>"$work/pytorch-$precision.txt"
    fi
  }
  pytorch
  before=$(wc -l <"$log")
  timed "$(($(remaining) / 3))" "$run" troupe bench compute --device cuda --precision "$precision" \
    --seconds 4 --json "$work/compute-$precision.json"
  compute_rc=$rc compute_took=$took
  tail -n +$((before + 2)) "$log" >>"$OUT/bench.log"
  pytorch
  if [ "$compute_rc" -eq 0 ]; then
    record "bench_compute_$precision" passed "$compute_took" "$(grep '^troupe_mlp ' "$OUT/bench.log" | tail -1)"
  else
    record "bench_compute_$precision" failed "$compute_took" "exit status $compute_rc"
  fi
  if [ "$pytorch_ready" = yes ] && [ -s "$work/pytorch-$precision.txt" ]; then
    record "pytorch_$precision" passed 0 "$(tail -1 "$work/pytorch-$precision.txt" | cut -c1-120)"
  else
    record "pytorch_$precision" failed 0 "python3 with a CUDA-enabled torch is missing, or the script failed"
  fi
done

# 5. The GPT example (apps/examples/gpt_fortunes.toml, on the bundle's text) against PyTorch eager
#    on the GPU at fp32: per-step losses of a 4-stage sync pipeline, then tokens/s in alternating
#    rounds of one stage, 4 stages and PyTorch.
if [ -n "$skip_reason" ]; then
  record gpt_compare skipped 0 "$skip_reason"
  record gpt_speed skipped 0 "$skip_reason"
elif [ "$pytorch_ready" != yes ]; then
  record gpt_compare failed 0 "python3 with a CUDA-enabled torch is missing"
  record gpt_speed failed 0 "python3 with a CUDA-enabled torch is missing"
else
  printf '#!/bin/sh\nexec "%s" troupe "$@"\n' "$run" >"$work/troupe"
  chmod +x "$work/troupe"
  gpt=(python3 "$bundle/apps/bench/pytorch_gpt.py")
  gpt_options=(--device cuda --troupe "$work/troupe" --set "data.path=\"$bundle/data/text\"")
  for part in compare speed; do
    before=$(wc -l <"$log")
    if [ "$part" = compare ]; then
      timed "$(($(remaining) / 4))" "${gpt[@]}" compare "$bundle/apps/examples/gpt_fortunes.toml" \
        "${gpt_options[@]}" --steps 20
    else
      timed "$(($(remaining) / 3))" "${gpt[@]}" speed "$bundle/apps/examples/gpt_fortunes.toml" \
        "${gpt_options[@]}" --rounds 5 --steps 40 --pipelines 4:sync:8 4:async:4
    fi
    tail -n +$((before + 2)) "$log" | tee -a "$OUT/bench.log" >"$work/gpt-$part.txt"
    if [ "$rc" -eq 0 ]; then
      record "gpt_$part" passed "$took" "$(grep -E '^(worst|troupe 1 stage)' "$work/gpt-$part.txt" | tail -1 | tr -s ' ')"
    else
      record "gpt_$part" failed "$took" "exit status $rc"
    fi
  done
fi

# 6. Stages sharing the one GPU: 2 and 4 in one process and 2 worker processes, against one stage.
if [ -n "$skip_reason" ]; then
  record bench_pipeline skipped 0 "$skip_reason"
else
  before=$(wc -l <"$log")
  timed "$(($(remaining) - 30))" "$run" troupe bench pipeline --device cuda --seconds 10 --json "$work/pipeline.json"
  tail -n +$((before + 2)) "$log" >>"$OUT/bench.log"
  if [ "$rc" -eq 0 ]; then
    record bench_pipeline passed "$took" "$(tail -n +$((before + 2)) "$log" | grep '4-stage async' | sed 's/^ *//')"
  else
    record bench_pipeline failed "$took" "exit status $rc"
  fi
fi

# 7. The summary.
if ! "$run" troupe_device_summary "$work" "$OUT" "$bundle" | tee -a "$log"; then
  note "could not write $OUT/summary.json"
  exit 1
fi
if grep -q "$(printf '\tfailed\t')" "$work/steps.tsv"; then exit 1; fi
exit 0
