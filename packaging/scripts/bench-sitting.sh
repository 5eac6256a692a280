#!/usr/bin/env bash
# One benchmark sitting: the peer job queues of shared/bench, then backhaul-bench queue on both
# stores, on the same machine, in two consecutive blocks (all the peers' runs, then all of ours),
# and a table of the job-queue goals.
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
root_sql() {
  mariadb --no-defaults --socket="$(cat "$mariadb_dir/socket.txt")" -uroot --batch \
    --skip-column-names -e "$1" 2>/dev/null
}
# After a MySQL run has dropped its database, InnoDB still purges the run's undo history in the
# background: wait until that history is small (at most 30 s), so that it does not slow the next
# run; a few seconds when the length cannot be read.
settle_mysql() {
  local len
  for _ in $(seq 1 60); do
    len=$(root_sql "SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'" | awk '{print $2}' ||
      true)
    if ! [[ $len =~ ^[0-9]+$ ]]; then sleep 3; return; fi
    [ "$len" -lt 1000 ] && return
    sleep 0.5
  done
}
# The job shapes (docs/benchmarks.md): the peers' primary rows take one job per claim, 8 in flight,
# each worker fetching its own; their TUNED rows keep at most 8 in flight; 256/256 keeps up to 264
# leased, more than any peer row. Ours claim through a loop per worker (--claimers 8), as the peers'
# workers fetch; the W1 rows of one claim loop, the daemon's default, are measured too.
strict=(--claim-batch 1 --prefetch 0 --claimers 8)  # one job per claim, like the peers' primary
strict1=(--claim-batch 1 --prefetch 0)
each=(--claimers 8)  # defaults otherwise: claims of up to 8, like the peers' TUNED rows
tuned=(--claim-batch 256 --prefetch 256)
# One configuration by name. The caps pair at 256/256 uses a cap that never binds (1000 per key
# for 2000 jobs a key); the binding pair (1 per key over 10 keys, default settings) is reported
# apart.
config() {
  local name=$1 rep=$2
  case $name in
    sqlite-w1-strict) run --store sqlite "${strict[@]}" --rep "$rep" ;;
    sqlite-w1-strict1) run --store sqlite "${strict1[@]}" --rep "$rep" ;;
    sqlite-w1-default) run --store sqlite "${each[@]}" --rep "$rep" ;;
    sqlite-w1-default1) run --store sqlite --rep "$rep" ;;
    sqlite-w1-256) run --store sqlite "${tuned[@]}" --rep "$rep" ;;
    sqlite-w2-strict) run --store sqlite "${strict[@]}" --workload retries --rep "$rep" ;;
    sqlite-w2-default) run --store sqlite "${each[@]}" --workload retries --rep "$rep" ;;
    sqlite-w2-256) run --store sqlite "${tuned[@]}" --workload retries --rep "$rep" ;;
    mysql-*)
      case $name in
        mysql-w1-strict) run "${mysql[@]}" "${strict[@]}" --rep "$rep" ;;
        mysql-w1-strict1) run "${mysql[@]}" "${strict1[@]}" --rep "$rep" ;;
        mysql-w1-default) run "${mysql[@]}" "${each[@]}" --rep "$rep" ;;
        mysql-w1-default1) run "${mysql[@]}" --rep "$rep" ;;
        mysql-w1-256) run "${mysql[@]}" "${tuned[@]}" --rep "$rep" ;;
        mysql-w1-256-p3) run "${mysql[@]}" "${tuned[@]}" --processes 3 --rep "$rep" ;;
        mysql-w2-strict) run "${mysql[@]}" "${strict[@]}" --workload retries --rep "$rep" ;;
        mysql-w2-default) run "${mysql[@]}" "${each[@]}" --workload retries --rep "$rep" ;;
        mysql-w2-256) run "${mysql[@]}" "${tuned[@]}" --workload retries --rep "$rep" ;;
      esac
      settle_mysql
      ;;
    keys-256) run --store sqlite "${tuned[@]}" --keys 10 --rep "$rep" ;;
    keys-256-cap1000) run --store sqlite "${tuned[@]}" --keys 10 --per-key-cap 1000 --rep "$rep" ;;
    keys-default) run --store sqlite --keys 10 --rep "$rep" ;;
    keys-default-cap1) run --store sqlite --keys 10 --per-key-cap 1 --rep "$rep" ;;
    latency) run --store sqlite --workload latency --rep "$rep" ;;
    *) echo "bench-sitting: no configuration $name" >&2; exit 1 ;;
  esac
}
configs=(sqlite-w1-strict sqlite-w1-strict1 sqlite-w1-default sqlite-w1-default1 sqlite-w1-256
  sqlite-w2-strict sqlite-w2-default sqlite-w2-256 mysql-w1-strict mysql-w1-strict1 mysql-w1-default
  mysql-w1-default1 mysql-w1-256 mysql-w1-256-p3 mysql-w2-strict mysql-w2-default mysql-w2-256
  keys-256 keys-256-cap1000 keys-default keys-default-cap1 latency)
stamp "ours-start"
# Each rep runs every configuration once, the list rotated by the rep's index, so that no
# configuration always runs first (after the peers) or always after the same neighbour.
for rep in $(seq 1 "$reps"); do
  shift_by=$(((rep - 1) * ${#configs[@]} / reps))
  for k in $(seq 0 $((${#configs[@]} - 1))); do
    config "${configs[$(((k + shift_by) % ${#configs[@]}))]}" "$rep"
  done
done
# The million-job backlog, three times (the summary takes the median).
for rep in $(seq 1 3); do
  run --store sqlite "${tuned[@]}" --jobs 1000000 --rep "$rep"
done
stamp "ours-end"

peer_files=()
[ -s "$out/peers.jsonl" ] && peer_files=("$out/peers.jsonl")
python3 "$root/packaging/scripts/bench_summary.py" "$ours" "${peer_files[@]}" | tee "$out/summary.md"
