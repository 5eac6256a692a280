#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test.
# Usage: packaging/scripts/test.sh [PRESET]     (default: dev; "asan" runs the suite under ASan+UBSan)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
preset=${1:-dev}

bash "$root/packaging/scripts/build.sh" "$preset"
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --preset "$preset" -j "$jobs"
