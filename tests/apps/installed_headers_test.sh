#!/usr/bin/env bash
# Installs this build into a fresh prefix and checks its include tree: it holds exactly the
# public headers of cmake/install.cmake (troupe.h and what it includes), each compiles on its own
# against the prefix and reaches no CAF, ZeroMQ, Cereal or CUDA header, and <troupe/troupe.h>
# offers no test hook (no pipeline_options::fault_hook).
# Usage: installed_headers_test.sh BUILD_DIR [CXX]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: installed_headers_test.sh BUILD_DIR [CXX]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
compiler="${2:-c++}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
fail() { echo "installed_headers_test.sh: FAIL: $*" >&2; exit 1; }

prefix="$scratch/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
include="$prefix/include"
listed="$build/troupe_public_headers.txt"
[ -f "$listed" ] || fail "$listed is missing (configure the build again)"

# 1. Exactly the listed headers, nothing else under include/.
(cd "$include" && find . -type f | sed 's|^\./||' | sort) >"$scratch/installed"
sed 's|^|troupe/|' "$listed" | sort >"$scratch/expected"
diff -u "$scratch/expected" "$scratch/installed" >"$scratch/diff" ||
  fail "the installed include tree is not the public header list:"$'\n'"$(cat "$scratch/diff")"
count="$(wc -l <"$scratch/installed")"

# 2. Each header on its own, with only the prefix (and the system) to include from. -H lists
# every header the compiler opened; none may be CAF's, ZeroMQ's, Cereal's or CUDA's.
flags=(-std=c++17 -fsyntax-only -H -I"$include" -I"$include/troupe")
forbidden='/caf/|zmq|/cereal/|cuda_runtime|cublas|/cuda/'
while read -r header; do
  echo "#include <troupe/$header>" >"$scratch/one.cpp"
  "$compiler" "${flags[@]}" "$scratch/one.cpp" 2>"$scratch/one.log" ||
    fail "<troupe/$header> does not compile on its own against $prefix:"$'\n'"$(head -n 20 "$scratch/one.log")"
  if grep -E "^\.+ .*($forbidden)" "$scratch/one.log" >"$scratch/bad"; then
    fail "<troupe/$header> includes internals:"$'\n'"$(head -n 5 "$scratch/bad")"
  fi
  sed -n 's|^\.* \(/.*\)$|\1|p' "$scratch/one.log" | grep -v -e "^$include/" -e '^/usr/' \
    >"$scratch/bad" && fail "<troupe/$header> reaches outside the prefix:"$'\n'"$(head -n 5 "$scratch/bad")"
done <"$listed"
grep -rnE '#include <(caf|zmq|cereal|cuda)|\<(caf|zmq|cereal)::|namespace (caf|zmq)\>' "$include" \
  >"$scratch/bad" && fail "installed headers name internals:"$'\n'"$(head -n 5 "$scratch/bad")"

# 3. Every installed header is reached from troupe.h: the set holds nothing that is not public.
echo "#include <troupe/troupe.h>" >"$scratch/all.cpp"
"$compiler" "${flags[@]}" "$scratch/all.cpp" 2>"$scratch/all.log"
sed -n 's|^\.* \(.*\)$|\1|p' "$scratch/all.log" | grep "^$include/" |
  xargs -n1 realpath --relative-to="$include" | sort -u >"$scratch/reached"
echo "troupe/troupe.h" >>"$scratch/reached"
sort -u -o "$scratch/reached" "$scratch/reached"
diff -u "$scratch/installed" "$scratch/reached" >"$scratch/diff" ||
  fail "installed headers that troupe.h does not reach (or the reverse):"$'\n'"$(cat "$scratch/diff")"

# 4. No test hook in the API: pipeline_options has no fault_hook, and no hook is declared. The
# same check on a member that is there (monitor) shows that the probe can see one.
cat >"$scratch/hook.cpp" <<'CPP'
#include <troupe/troupe.h>
#include <type_traits>
template <typename T, typename = void>
struct has_fault_hook : std::false_type {};
template <typename T>
struct has_fault_hook<T, std::void_t<decltype(&T::fault_hook)>> : std::true_type {};
template <typename T, typename = void>
struct has_monitor : std::false_type {};
template <typename T>
struct has_monitor<T, std::void_t<decltype(&T::monitor)>> : std::true_type {};
static_assert(!has_fault_hook<troupe::actors::pipeline_options>::value,
              "pipeline_options::fault_hook is reachable from <troupe/troupe.h>");
static_assert(has_monitor<troupe::actors::pipeline_options>::value, "the probe sees no member");
int main() {}
CPP
"$compiler" -std=c++17 -fsyntax-only -I"$include" -I"$include/troupe" "$scratch/hook.cpp" \
  2>"$scratch/hook.log" || fail "the hook probe:"$'\n'"$(head -n 20 "$scratch/hook.log")"
grep -rlE 'fault_hook|stage_message_hook|run_pipeline_with_hook|pipeline_test_seam' "$include" \
  >"$scratch/bad" && fail "a test hook is installed: $(tr '\n' ' ' <"$scratch/bad")"

echo "installed_headers_test.sh: $count headers, exactly the public list, each compiles alone" \
  "without CAF, ZeroMQ, Cereal or CUDA headers, all reached from troupe.h; no fault_hook"
