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
# On a machine with a GPU, a step of GPU tests in which every test skipped, or any test found no
# CUDA device, fails: a CUDA runtime that does not start makes them all skip.
# Usage: OUT=DIR tests/gpu/device_check.sh [BUNDLE]
#   BUNDLE defaults to $TROUPE_BUNDLE, then device-bundle/ in the repository, then the bundle
#   that tests/gpu/bundle.sh made last (build/last-device-bundle).
# Sourced (`source tests/gpu/device_check.sh`), it only defines gpu_test_filter, gtest_counts,
# gpu_tests_verdict and the filters' extra patterns, for tests of them.
set -uo pipefail
repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# gpu_test_filter FOLDER [EXTRA]: the gtest filter of the GPU tests whose sources are under
# tests/FOLDER: every suite of its cuda_*.cpp files whole, and elsewhere each test whose body
# asks whether there is a device (cuda_device_count(), nccl_compiled(), TROUPE_REQUIRE_CUDA:
# it skips itself, or checks something else, without one), then the colon-separated patterns
# of EXTRA. Built from the sources, so that a new GPU suite or test cannot be left out.
gpu_test_filter() {
  local folder="$1" extra="${2:-}" file
  {
    while read -r file; do
      awk -v whole="$(case "${file##*/}" in cuda_*) echo 1 ;; *) echo 0 ;; esac)" '
        /^(TEST|TEST_F|TEST_P)\(/ {
          header = $0
          while (header !~ /\)/ && (getline more) > 0) header = header more
          parametrized = header ~ /^TEST_P/
          sub(/^[A-Z_]+\( */, "", header)
          split(header, parts, /[ ,)]+/)
          suite = parts[1]; name = parts[2]; listed = 0
          if (whole) print (parametrized ? "*" : "") suite ".*"
          next
        }
        !whole && suite != "" && !listed && /cuda_device_count\(|nccl_compiled\(|TROUPE_REQUIRE_CUDA/ {
          print (parametrized ? "*" : "") suite "." name (parametrized ? "/*" : "")
          listed = 1
        }' "$file"
    done < <(find "$repository/tests/$folder" -name '*.cpp' | sort)
    tr ':' '\n' <<<"$extra"
  } | awk 'NF && !seen[$0]++' | paste -sd: -
}

# gtest_counts XML: "TESTS FAILED SKIPPED NO_DEVICE" of a gtest XML report: its tests, those
# that failed, those skipped, and those skipped with "no CUDA device"; zeros without a report.
gtest_counts() {
  local xml="$1" failed
  if [ ! -s "$xml" ]; then
    echo "0 0 0 0"
    return
  fi
  failed="$(sed -n 's/.*<testsuites tests="[0-9]*" failures="\([0-9]*\)".*/\1/p' "$xml" | head -1)"
  echo "$(grep -c '<testcase ' "$xml") ${failed:-0} $(grep -c '<testcase [^>]*result="skipped"' "$xml")" \
    "$(grep -c '<skipped message="[^"]*no CUDA device' "$xml")"
}

# gpu_tests_verdict GPU CUDA_BUILT RC XML: "STATUS<TAB>DETAIL" of a step of GPU tests that
# exited with RC and wrote XML, on a machine with a GPU or not (GPU yes/no) from a bundle with
# the CUDA backend or without (CUDA_BUILT yes/no). Without a GPU the tests skip themselves:
# "skipped" when they ran. With one, the step fails when the bundle has no CUDA backend, every
# test skipped, or a test found no CUDA device.
gpu_tests_verdict() {
  local gpu="$1" cuda_built="$2" rc="$3" xml="$4" tests failed skipped no_device counts
  read -r tests failed skipped no_device < <(gtest_counts "$xml")
  counts="$tests tests, $failed failed, $skipped skipped"
  if [ "$rc" -ne 0 ]; then
    printf 'failed\texit status %s: %s\n' "$rc" "$counts"
  elif [ ! -s "$xml" ]; then
    printf 'failed\tno gtest XML report\n'
  elif [ "$tests" -eq 0 ]; then
    printf 'failed\tthe filter matched no test\n'
  elif [ "$gpu" != yes ]; then
    printf 'skipped\tno GPU (nvidia-smi is missing or lists none): %s\n' "$counts"
  elif [ "$cuda_built" != yes ]; then
    printf 'failed\ta GPU, but the bundle was built without CUDA: %s\n' "$counts"
  elif [ "$skipped" -eq "$tests" ]; then
    printf 'failed\tevery test skipped though nvidia-smi lists a GPU: %s\n' "$counts"
  elif [ "$no_device" -gt 0 ]; then
    printf 'failed\t%s found no CUDA device though nvidia-smi lists a GPU: %s\n' "$no_device" "$counts"
  else
    printf 'passed\t%s\n' "$counts"
  fi
}

# Besides the tests found in the sources, the GPU steps run the CPU side of the precision and
# device-group suites (troupe_layers_tests) and every test named for CUDA, a GPU, reduced
# precision or NCCL (troupe_actors_tests).
layers_extra='GemmPrecisionTest.*:DeviceGroupTest.*'
actors_extra='*Cuda*:*Gpu*:*ReducedPrecision*:*Nccl*'

# Sourced: the functions and filters above only.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi

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
  local verdict
  timed "$(($(remaining) / 3))" "$run" "$2" --gtest_filter="$3" --gtest_output="xml:$4"
  verdict="$(gpu_tests_verdict "$gpu" "$cuda_built" "$rc" "$4")"
  record "$1" "${verdict%%$'\t'*}" "$took" "${verdict#*$'\t'}"
}
layers_filter="$(gpu_test_filter layers "$layers_extra")"
actors_filter="$(gpu_test_filter actors "$actors_extra")"
note "GPU tests of troupe_layers_tests: $layers_filter"
note "GPU tests of troupe_actors_tests: $actors_filter"
test_step gpu_tests_layers troupe_layers_tests "$layers_filter" "$OUT/gpu-tests-layers.xml"
test_step gpu_tests_actors troupe_actors_tests "$actors_filter" "$OUT/gpu-tests-actors.xml"

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
