#!/usr/bin/env bash
# SPEC A6 as a connector author meets it: the SDK of this build is installed to a new prefix, and
# the connector template installed with it is built out of tree, once with find_package(BackhaulSDK)
# and once by hand with pkg-config's flags. Each plugin must export backhaul_entry and nothing
# else, and pass `backhaul plugin validate` at full strictness against the template's fixtures.
#   out_of_tree_test.sh <this build's directory> <the backhaul CLI>
set -euo pipefail
build_dir=$1
backhaul=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "out-of-tree: $*" >&2
  exit 1
}

# Only backhaul_entry is exported.
exports_only_the_entry() {
  local exported
  exported=$(nm -D --defined-only "$1" | awk '{print $NF}' | sort -u | tr '\n' ' ')
  [ "$exported" = "backhaul_entry " ] || fail "$1 exports: $exported"
}

cmake --install "$build_dir" --component sdk --prefix "$work/prefix" >"$work/install.log" ||
  { cat "$work/install.log" >&2; fail "installing the SDK failed"; }
template="$work/prefix/share/backhaul/connector-template"
[ -f "$template/CMakeLists.txt" ] || fail "no connector template in $template"

# With CMake, finding only what was installed (not this source tree).
cmake -S "$template" -B "$work/cmake-build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring the template failed"; }
cmake --build "$work/cmake-build" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "building the template failed"; }
exports_only_the_entry "$work/cmake-build/tickets.so"
# (A minute per child: the 50 MB body of fault_huge_body is slow to parse under the sanitizers.)
"$backhaul" plugin validate "$work/cmake-build/tickets.so" --timeout-ms 60000 \
  --fixtures "$template/fixtures" ||
  fail "the template built with CMake did not pass validation"

# With pkg-config, from wherever the prefix is.
cflags=$(PKG_CONFIG_PATH="$work/prefix/share/pkgconfig" pkg-config --cflags backhaul-sdk)
include_dir=$(echo $cflags)  # one word, "-I<dir>"
include_dir=${include_dir#-I}
[ "$(realpath -m "$include_dir")" = "$(realpath "$work/prefix/include")" ] ||
  fail "pkg-config --cflags backhaul-sdk: '$cflags', not the installed include directory"
g++ -std=c++17 -O2 -shared -fPIC -fvisibility=hidden $cflags \
  -Wl,--version-script="$template/exports.map" -Wl,-z,defs "$template/tickets_connector.cpp" \
  -o "$work/by-hand.so"
exports_only_the_entry "$work/by-hand.so"
"$backhaul" plugin validate "$work/by-hand.so" --timeout-ms 60000 \
  --fixtures "$template/fixtures" ||
  fail "the template built with pkg-config did not pass validation"
echo "out-of-tree: the template built with find_package and with pkg-config; both passed"
