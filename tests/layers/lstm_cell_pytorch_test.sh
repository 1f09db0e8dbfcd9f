#!/usr/bin/env bash
# lstm_cell_pytorch_test.py on what troupe_lstm_cell_dump writes, with the first python3 that
# has torch. Skips (exit 77) where none has.
# Usage: lstm_cell_pytorch_test.sh DUMP_PROGRAM
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python=""
for candidate in /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
    python="$candidate"
    break
  fi
done
[ -n "$python" ] || { echo "lstm_cell_pytorch_test.sh: no python3 with torch; skipped"; exit 77; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$1" "$scratch/cells.txt"
"$python" "$here/lstm_cell_pytorch_test.py" "$scratch/cells.txt"
