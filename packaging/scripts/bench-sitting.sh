#!/usr/bin/env bash
# One benchmark sitting: the peer job queues of shared/bench, then backhaul-bench queue on both
# stores, on the same machine in the same minutes, and a table of the job-queue goals.
#
# Usage: packaging/scripts/bench-sitting.sh OUTDIR
#
#   PEERS_DIR=DIR   the peers' harness (default: ../shared/bench/peers beside the project);
#                   it is copied to a temp dir, since run-all.sh writes into its folder.
#                   PEERS_DIR=none measures only Backhaul.
#   BENCH=PATH      the benchmark program (default: build/dev/bin/backhaul-bench)
#   REPS=N          runs of each configuration (default 3; figures are medians)
#
# Writes OUTDIR/peers.jsonl (the peers' result lines), OUTDIR/ours.jsonl (ours), OUTDIR/times
# (when each part ran) and OUTDIR/summary.md (the goals, printed too). Builds nothing: build
# first, and do not build or run anything else during a sitting. The MariaDB server is the
# private one of packaging/scripts/mariadb.sh in build/bench-mariadb; one this script started is
# stopped again by its PID.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
bench=${BENCH:-$root/build/dev/bin/backhaul-bench}
reps=${REPS:-3}
peers=${PEERS_DIR:-$root/../shared/bench/peers}
[ -x "$bench" ] || { echo "bench-sitting: $bench not found (build it first)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-sitting: python3 is needed" >&2; exit 1; }
: >"$out/times"
stamp() { echo "$1 $(date -u +%FT%TZ)" >>"$out/times"; }

if [ "$peers" != none ]; then
  [ -x "$peers/run-all.sh" ] || { echo "bench-sitting: no run-all.sh in $peers" >&2; exit 1; }
  work=$(mktemp -d -t backhaul-peers.XXXXXX)
  chmod 755 "$work"  # the peers' servers run as their own users (postgres) and must reach it
  cp -r "$peers/." "$work/"
  stamp "peers-start"
  (cd "$work" && REPS=$reps RESULTS="$out/peers.jsonl" ./run-all.sh >"$out/peers.log" 2>&1) ||
    { echo "bench-sitting: the peers failed; see $out/peers.log" >&2; exit 1; }
  # run-all.sh goes on past a peer that fails: every peer must have its lines, all correct.
  for peer in pg-boss graphile-worker bullmq beanstalkd; do
    grep -q "\"peer\":\"$peer\"" "$out/peers.jsonl" ||
      { echo "bench-sitting: no results from $peer; see $out/peers.log" >&2; exit 1; }
  done
  if grep -q '"ok":false' "$out/peers.jsonl"; then
    echo "bench-sitting: a peer's run ended in a wrong state; see $out/peers.jsonl" >&2
    exit 1
  fi
  cp "$work/env.json" "$out/peers-env.json" 2>/dev/null || true
  rm -rf "$work"
  stamp "peers-end"
fi
sync  # the peers' dirty pages are written back now, not during our fsyncs

mariadb_dir=$root/build/bench-mariadb
started_mariadb=0
if ! bash "$root/packaging/scripts/mariadb.sh" status "$mariadb_dir" >/dev/null 2>&1; then
  bash "$root/packaging/scripts/mariadb.sh" start "$mariadb_dir" >/dev/null
  started_mariadb=1
fi
stop_mariadb() {
  if [ $started_mariadb = 1 ]; then bash "$root/packaging/scripts/mariadb.sh" stop "$mariadb_dir" >/dev/null; fi
}
trap stop_mariadb EXIT
# MySQL runs also record the server's CPU over each run (server_cpu_s), as the peers' lines do.
mysql=(--store mysql --mysql "$(cat "$mariadb_dir/connection.txt")"
  --server-pid "$(cat "$mariadb_dir/mysqld.pid")")

ours=$out/ours.jsonl
: >"$ours"
run() { "$bench" queue "$@" >>"$ours"; }
tuned=(--claim-batch 256 --prefetch 256)
stamp "ours-start"
for rep in $(seq 1 "$reps"); do
  run --store sqlite "${tuned[@]}" --rep "$rep"
  run --store sqlite "${tuned[@]}" --workload retries --rep "$rep"
  run "${mysql[@]}" "${tuned[@]}" --rep "$rep"
  run "${mysql[@]}" "${tuned[@]}" --processes 3 --rep "$rep"
  run "${mysql[@]}" "${tuned[@]}" --workload retries --rep "$rep"
  run --store sqlite "${tuned[@]}" --keys 10 --rep "$rep"
  run --store sqlite "${tuned[@]}" --keys 10 --per-key-cap 1000 --rep "$rep"
  run --store sqlite --workload latency --rep "$rep"
done
# Defaults (no tuning flags), once each, and the million-job backlog.
run --store sqlite --rep 1
run --store sqlite --workload retries --rep 1
run "${mysql[@]}" --rep 1
run "${mysql[@]}" --workload retries --rep 1
run --store sqlite "${tuned[@]}" --jobs 1000000 --rep 1
stamp "ours-end"

peer_files=()
[ -s "$out/peers.jsonl" ] && peer_files=("$out/peers.jsonl")
python3 "$root/packaging/scripts/bench_summary.py" "$ours" "${peer_files[@]}" | tee "$out/summary.md"
