#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test.
# Usage: packaging/scripts/test.sh [PRESET]     (default: dev; "asan" runs the suite under ASan+UBSan)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
preset=${1:-dev}

bash "$root/packaging/scripts/build.sh" "$preset"
cd "$root"
# ctest stops the private MariaDB of the MySQL tests at its end (the mariadb_stop fixture). A run
# cut short (Ctrl-C, a CI timeout) skips that, and the server runs in a session of its own: stop it
# here too, by its PID (mariadb.sh), whatever ends this script.
trap 'bash "$root/packaging/scripts/mariadb.sh" stop "$root/build/$preset/mariadb" >/dev/null 2>&1 || true' EXIT
jobs=$(nproc 2>/dev/null || echo 2)
ctest --preset "$preset" -j "$jobs"
