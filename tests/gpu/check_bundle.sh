#!/usr/bin/env bash
# Proves a device bundle self-contained without a GPU: every library that every bundled program
# and library asks for (its ELF NEEDED entries) is in the bundle's lib/ or is one that the
# device image has (tests/gpu/device_image_libraries.txt), no file asks those for a newer
# symbol version than the image is known to carry, the files device_check.sh needs are there,
# and the bundle fits in a device call (with the repository beside it).
# Usage: tests/gpu/check_bundle.sh DIR; exit status 0 when it holds, 1 (saying why) when not.
set -euo pipefail
bundle="${1:?usage: tests/gpu/check_bundle.sh DIR}"
repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
listing="$repository/tests/gpu/device_image_libraries.txt"
provided="$(grep -v -e '^#' -e '^version ' "$listing")"
# A device call carries 64 MiB: the repository's files, the bundle, and a MiB to spare.
repository_bytes="$(git -C "$repository" ls-files -z 2>/dev/null | (cd "$repository" && du -cb --files0-from=- 2>/dev/null) | tail -1 | cut -f1)"
limit_bytes=$(((63 << 20) - ${repository_bytes:-$((4 << 20))}))
problems=0
problem() { echo "check_bundle.sh: $*"; problems=$((problems + 1)); }

for required in run.sh manifest.json bin/troupe bin/troupe_device_summary apps/bench/pytorch_mlp.py \
  apps/bench/tuning.py apps/bench/gpt_model.py apps/examples/fashion_mlp.toml; do
  [ -e "$bundle/$required" ] || problem "$bundle/$required is missing"
done
ls "$bundle"/data/fashion-mnist/train-images-idx3-ubyte* >/dev/null 2>&1 || problem "no Fashion-MNIST in $bundle/data/fashion-mnist"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
elf_files=()
for file in "$bundle"/bin/* "$bundle"/lib/*; do
  [ -f "$file" ] || continue
  case "$file" in
    *.xz) plain="$scratch/$(basename "${file%.xz}")"; xz -dc "$file" >"$plain"; elf_files+=("$plain") ;;
    *) elf_files+=("$file") ;;
  esac
done

newer_than() {  # newer_than VERSION LIMIT: whether VERSION sorts after LIMIT
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -1)" = "$1" ]
}
checked=0
for file in "${elf_files[@]}"; do
  name="${file#"$bundle"/}"
  name="${name#"$scratch"/}"
  if ! readelf -h "$file" >/dev/null 2>&1; then problem "$name is not an ELF file"; continue; fi
  checked=$((checked + 1))
  for needed in $(readelf -d --wide "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    if [ -e "$bundle/lib/$needed" ] || [ -e "$bundle/lib/$needed.xz" ]; then continue; fi
    grep -qxF "$needed" <<<"$provided" && continue
    problem "$name needs $needed, which is neither in $bundle/lib nor in the device image"
  done
  while read -r family limit; do
    for version in $(readelf -V --wide "$file" | grep -o "Name: ${family}_[0-9.]*" | sed "s/Name: ${family}_//" | sort -uV); do
      newer_than "$version" "$limit" && problem "$name asks for ${family}_$version; the device image is known to carry ${family}_$limit"
    done
  done < <(sed -n 's/^version \([A-Z]*\)_\([0-9.]*\)$/\1 \2/p' "$listing")
done

bytes="$(du -sb "$bundle" | cut -f1)"
[ "$bytes" -le "$limit_bytes" ] || problem "$bundle holds $bytes bytes, over the $limit_bytes that a device call leaves beside the repository"
if [ "$problems" -gt 0 ]; then
  echo "check_bundle.sh: $bundle is not self-contained ($problems problem(s))"
  exit 1
fi
echo "check_bundle.sh: $bundle is self-contained: $checked ELF files, every library in the bundle or the device image, $((bytes >> 20)) MiB"
