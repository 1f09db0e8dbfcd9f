#!/usr/bin/env bash
# Installs this build into a fresh prefix, builds apps/examples/custom_layer against the
# installed package (find_package(troupe), troupe::engine) and trains it: the library as an
# outside program uses it. Usage: custom_layer_test.sh BUILD_DIR
set -euo pipefail
build="$1"
source="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
[ -f "$scratch/prefix/include/troupe/troupe.h" ] || { echo "troupe.h was not installed"; exit 1; }
cmake -S "$source/apps/examples/custom_layer" -B "$scratch/example" \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/example" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
output="$("$scratch/example/custom_layer" 2>&1)"
echo "$output"
accuracy="$(sed -n 's/.*final_test_accuracy \([0-9.]*\).*/\1/p' <<<"$output")"
# One epoch of this MLP reaches about 0.84; below 0.75 the custom layer does not learn.
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a >= 0.75) }' ||
  { echo "custom_layer_test.sh: accuracy ${accuracy:-missing} is below 0.75"; exit 1; }
echo "custom_layer_test.sh: built against the installed package and trained to $accuracy"
