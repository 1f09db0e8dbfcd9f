#!/usr/bin/env bash
# Runs a program of this device bundle with the bundle's shared libraries:
#   run.sh NAME [ARGS...]      runs bin/NAME
#   run.sh COMMAND [ARGS...]   runs any other command (compute-sanitizer, python3) with the same
#                              library path, so that the bundled programs it starts find theirs
# Libraries and programs packed as lib/NAME.xz and bin/NAME.xz are unpacked on first use into $TMPDIR (default /tmp), in a
# folder named by the bundle's checksum. CUDA's own libraries
# come from the machine: from the loader's cache, or from where CUDA toolkits and PyTorch's
# wheels keep them.
set -euo pipefail
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ $# -lt 1 ]; then
  echo "usage: $0 PROGRAM [ARGS...]   (programs: $(ls "$bundle/bin" | sed 's/\.xz$//' | tr '\n' ' '))" >&2
  exit 2
fi

unpack() {  # unpack PACKED TARGET: xz when there is one, else Python's lzma
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$1" >"$2"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
  fi
}
# Packed libraries are unpacked outside the bundle, so that it stays as small as it was packed.
unpacked="${TMPDIR:-/tmp}/troupe-bundle-$(cat "$bundle/manifest.json" "$bundle"/lib/*.xz "$bundle"/bin/*.xz 2>/dev/null | cksum | cut -d' ' -f1)"
mkdir -p "$unpacked"
for packed in "$bundle"/lib/*.xz "$bundle"/bin/*.xz; do
  [ -e "$packed" ] || continue
  target="$unpacked/$(basename "${packed%.xz}")"
  [ -e "$target" ] && continue
  unpack "$packed" "$target.$$"
  chmod 755 "$target.$$"
  mv -f "$target.$$" "$target"
done

library_path="$bundle/lib:$unpacked"
if ! { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep -q 'libcublas\.so\.13 '; then
  for directory in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
    /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
    if [ -e "$directory/libcublas.so.13" ] || [ -e "$directory/libcudart.so.13" ]; then
      library_path="$library_path:$directory"
    fi
  done
fi
export LD_LIBRARY_PATH="$library_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TROUPE_BUNDLE="$bundle"
if [ -x "$bundle/bin/$1" ] || [ -x "$unpacked/$1" ]; then
  program="$bundle/bin/$1"
  [ -x "$program" ] || program="$unpacked/$1"
  shift
  exec "$program" "$@"
fi
exec "$@"
