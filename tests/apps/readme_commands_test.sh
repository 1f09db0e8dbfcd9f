#!/usr/bin/env bash
# Runs every shell command of the README's ```sh blocks, as a user would from the repository
# root, and fails when one stops working. Each runs in a scratch directory that sees the
# repository's apps/ (so runs/ and installs go there, not into the checkout), with
# ./build/apps/troupe and `build` meaning this build, /tmp/ meaning the scratch directory, and
# every `troupe train` or `troupe converge` that sets no training.max_steps shortened to 40 steps,
# so that each finishes within a minute; the job and cluster files of its ```toml blocks are
# trained and simulated. Usage: readme_commands_test.sh BUILD_DIR [README]
set -euo pipefail
build="$(cd "$1" && pwd)"
source="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readme="${2:-$source/README.md}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
ln -s "$source/apps" "$scratch/apps"

# The commands: lines of ```sh blocks, continuation lines joined, comments left out.
commands="$scratch/commands.txt"
awk '
  /^```sh$/ { inside = 1; next }
  /^```/ { inside = 0; next }
  inside && /^[[:space:]]*#/ { next }
  inside && NF {
    line = line $0
    if (line ~ /\\$/) { sub(/\\$/, "", line); next }
    print line; line = ""
  }' "$readme" >"$commands"
count="$(wc -l <"$commands")"
[ "$count" -ge 5 ] || { echo "readme_commands_test.sh: found only $count commands in $readme"; exit 1; }

shorten() {
  local command="$1"
  command="${command//.\/build\/apps\/troupe/$build/apps/troupe}"
  command="${command//cmake --install build /cmake --install $build }"
  command="${command//\/tmp\//$scratch/}"
  if [[ "$command" =~ troupe\ (train|converge) && "$command" != *training.max_steps=* ]]; then
    command+=" --set training.max_steps=40"
  fi
  printf '%s' "$command"
}

number=0
failed=0
while IFS= read -r original; do
  number=$((number + 1))
  command="$(shorten "$original")"
  log="$scratch/command-$number.log"
  start=$SECONDS
  if (cd "$scratch" && timeout 120 bash -c "$command") >"$log" 2>&1 </dev/null; then
    echo "ok   ($((SECONDS - start)) s) $original"
  else
    status=$?
    failed=$((failed + 1))
    echo "FAIL (status $status, $((SECONDS - start)) s) $original"
    echo "     ran as: $command"
    tail -n 20 "$log" | sed 's/^/     | /'
  fi
done <"$commands"
# The README's TOML examples: a job file trains, a cluster file simulates the example job.
awk -v dir="$scratch" '
  /^```toml$/ { inside = 1; blocks++; next }
  /^```/ { inside = 0; next }
  inside { print > (dir "/readme-" blocks ".toml") }' "$readme"
for file in "$scratch"/readme-*.toml; do
  [ -e "$file" ] || continue
  count=$((count + 1))
  if grep -q '^\[model\]' "$file"; then
    what="the job file"
    set -- train "$file" --set training.max_steps=20 --out "$scratch/readme-job"
  else
    what="the cluster file"
    set -- simulate apps/examples/fashion_mlp.toml --cluster "$file" --set training.max_steps=50
  fi
  if (cd "$scratch" && timeout 120 "$build/apps/troupe" "$@") >"$file.log" 2>&1 </dev/null; then
    echo "ok   $what of $(basename "$file")"
  else
    failed=$((failed + 1))
    echo "FAIL $what of $(basename "$file")"
    tail -n 20 "$file.log" | sed 's/^/     | /'
  fi
done
echo "readme_commands_test.sh: $((count - failed)) of $count README commands and examples work"
[ "$failed" -eq 0 ]
