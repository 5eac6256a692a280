#!/usr/bin/env bash
# Installs dependencies (when missing), configures and builds one preset.
# Usage: packaging/scripts/build.sh [PRESET] [TARGET...]     (default preset: dev)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
preset=${1:-dev}
shift || true

bash "$root/packaging/scripts/deps.sh"
cd "$root"
# Configured again when the presets changed since: ninja's own re-run of cmake does not watch
# CMakePresets.json, and would keep the old cache variables.
if [ ! -f "build/$preset/build.ninja" ] || [ CMakePresets.json -nt "build/$preset/build.ninja" ]; then
  cmake --preset "$preset" >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 2)
if [ $# -gt 0 ]; then
  cmake --build --preset "$preset" -j "$jobs" --target "$@"
else
  cmake --build --preset "$preset" -j "$jobs"
fi
