#!/usr/bin/env bash
# Fails when a C++ or CUDA source differs from .clang-format's layout.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(find actors apps layers sim tests transport -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)
clang-format --dry-run --Werror $files
echo "clang-format: $(echo "$files" | wc -l) files formatted"
