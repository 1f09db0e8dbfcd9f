#!/usr/bin/env bash
# Builds troupe with CUDA (Release; Hopper's sm_90 and the sm_80 that CI also compiles) and packs
# into DIR everything the GPU machine needs to run it, since its image has CUDA but none of
# Debian's libraries that troupe links:
#   bin/            troupe, the test executables that hold GPU tests (xz-packed), troupe_device_summary
#   lib/            every shared library they load that the device image lacks
#                   (tests/gpu/device_image_libraries.txt); those over 1 MiB as NAME.xz
#   data/fashion-mnist/, data/text/ (the fortunes text, for the GPT example), apps/examples/,
#   apps/bench/pytorch_mlp.py and pytorch_gpt.py (with the modules they import)
#   run.sh          DIR/run.sh NAME [ARGS...] runs bin/NAME with the bundle's libraries
#   manifest.json   what was built, from which commit, with which CUDA
# Usage: tests/gpu/bundle.sh DIR [--build-dir BUILD] [--no-build]
#   --build-dir   the build tree to use (default: build, the README's)
#   --no-build    pack what BUILD already holds
# The bundle's path is noted in BUILD/last-device-bundle for tests/gpu/device_check.sh
# (unless --no-build).
set -euo pipefail
# xz's preset for the packed libraries: 6 keeps the bundle small (TROUPE_BUNDLE_XZ_LEVEL: 1 is
# several times faster and packs them about 4 MiB larger, too large for a device call).
xz_level="${TROUPE_BUNDLE_XZ_LEVEL:-6}"
repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$repository/build"
bundle=""
do_build=yes
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$(realpath -m "$2")"; shift 2 ;;
    --no-build) do_build=no; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bundle.sh: unknown option '$1'" >&2; exit 2 ;;
    *) [ -z "$bundle" ] || { echo "bundle.sh: one DIR only (got '$bundle' and '$1')" >&2; exit 2; }
       bundle="$1"; shift ;;
  esac
done
[ -n "$bundle" ] || { echo "usage: tests/gpu/bundle.sh DIR [--build-dir BUILD] [--no-build]" >&2; exit 2; }
data="${TROUPE_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"
programs=(apps/troupe tests/troupe_layers_tests tests/troupe_actors_tests tests/troupe_device_summary)

if [ "$do_build" = yes ]; then
  cuda_options=()
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    cuda_options=(-DTROUPE_WITH_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=80;90")
  else
    echo "bundle.sh: nvcc not found (PATH, /usr/local/cuda/bin): the bundle will have no CUDA backend" >&2
  fi
  cmake -S "$repository" -B "$build" -DCMAKE_BUILD_TYPE=Release "${cuda_options[@]}" >/dev/null
  cmake --build "$build" -j"$(nproc)" --target troupe troupe_layers_tests troupe_actors_tests troupe_device_summary
fi
for program in "${programs[@]}"; do
  [ -x "$build/$program" ] || { echo "bundle.sh: $build/$program is missing; build it first (or drop --no-build)" >&2; exit 1; }
done
for file in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  ls "$data/$file"* >/dev/null 2>&1 || { echo "bundle.sh: $data/$file(.gz) is missing (apt-get install dataset-fashion-mnist)" >&2; exit 1; }
done

rm -rf "$bundle"
mkdir -p "$bundle"/{bin,lib,data/fashion-mnist,data/text,apps/examples,apps/bench}
bundle="$(cd "$bundle" && pwd)"
provided="$(grep -v -e '^#' -e '^version ' "$repository/tests/gpu/device_image_libraries.txt")"
declare -A copied=()
for program in "${programs[@]}"; do
  strip -o "$bundle/bin/$(basename "$program")" "$build/$program"
  # ldd lists the whole closure: every library the program loads, directly or not.
  while read -r name path; do
    if grep -qxF "$name" <<<"$provided" || [ -n "${copied[$name]:-}" ]; then continue; fi
    [ -e "$path" ] || { echo "bundle.sh: $program needs $name, which this machine lacks too" >&2; exit 1; }
    cp -L "$path" "$bundle/lib/$name"
    chmod 644 "$bundle/lib/$name"
    strip --strip-unneeded "$bundle/lib/$name" 2>/dev/null || true
    copied[$name]=1
  done < <(ldd "$build/$program" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
for library in "$bundle"/lib/*; do
  if [ "$(stat -c %s "$library")" -gt $((1 << 20)) ]; then xz "-$xz_level" -T0 "$library"; fi
done
# The test executables are packed too (run.sh unpacks them as it does the libraries); troupe
# itself stays plain, for the tools that run it directly (compute-sanitizer).
for program in "$bundle"/bin/troupe_*_tests; do xz "-$xz_level" -T0 "$program"; done
cp "$repository/tests/gpu/run.sh" "$bundle/run.sh"
cp "$data"/*-ubyte* "$bundle/data/fashion-mnist/"
cp "$repository"/apps/examples/*.toml "$bundle/apps/examples/"
cp "$repository"/apps/bench/{pytorch_mlp,pytorch_gpt,gpt_model,tuning}.py "$bundle/apps/bench/"
# The GPT example's text: the fortunes files as troupe's text data set reads them (regular
# files, no .dat or .u8 indexes).
text="${TROUPE_TEXT:-/usr/share/games/fortunes}"
[ -d "$text" ] || { echo "bundle.sh: $text is missing (apt-get install fortunes)" >&2; exit 1; }
find "$text" -maxdepth 1 -type f ! -name '.*' ! -name '*.dat' ! -name '*.u8' -size +0 \
  -exec cp {} "$bundle/data/text/" \;

cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -1; }
cuda="$(cache_value TROUPE_WITH_CUDA)"
commit="$(git -C "$repository" rev-parse HEAD 2>/dev/null || echo unknown)"
git -C "$repository" diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
nvcc_version="$({ nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null; } | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
json_list() { local first=1; printf '['; for item in "$@"; do [ $first = 1 ] || printf ', '; printf '"%s"' "$item"; first=0; done; printf ']'; }
cat >"$bundle/manifest.json" <<JSON
{
  "commit": "$commit",
  "cuda": $([ "$cuda" = ON ] && echo true || echo false),
  "cuda_architectures": "$(cache_value CMAKE_CUDA_ARCHITECTURES)",
  "nvcc": "${nvcc_version:-none}",
  "build_type": "$(cache_value CMAKE_BUILD_TYPE)",
  "executables": $(json_list $(ls "$bundle/bin")),
  "libraries": $(json_list $(ls "$bundle/lib")),
  "bytes": $(du -sb "$bundle" | cut -f1)
}
JSON
# A bundle packed for a test (--no-build) leaves the record of the last one made alone.
[ "$do_build" = no ] || echo "$bundle" >"$build/last-device-bundle"
echo "bundle.sh: $bundle: $(ls "$bundle/bin" | wc -l) programs, $(ls "$bundle/lib" | wc -l) libraries, $(du -sm "$bundle" | cut -f1) MiB (CUDA ${cuda:-OFF})"
