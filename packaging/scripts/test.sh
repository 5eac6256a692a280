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
# A server that will not stop is said, and fails the run.
stop_mariadb() {
  local rc=$?
  if ! bash "$root/packaging/scripts/mariadb.sh" stop "$root/build/$preset/mariadb" >/dev/null; then
    echo "test.sh: the private MariaDB server in build/$preset/mariadb did not stop" >&2
    [ $rc -ne 0 ] || rc=1
  fi
  exit $rc
}
trap stop_mariadb EXIT
jobs=$(nproc 2>/dev/null || echo 2)
ctest --preset "$preset" -j "$jobs"
