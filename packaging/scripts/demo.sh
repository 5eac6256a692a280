#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, then runs a real backfill the way an
# operator does. It starts the sandbox (fake GitHub, Vercel and gateway on 127.0.0.1) and the
# daemon, backhauld, on the embedded SQLite store with the real connector plugins; starts one run
# per connector through the admin API with `backhaul run start`; shows their progress; prints each
# run's summary next to what the gateway received; and stops what it started (by PID). Exits
# non-zero when a run fails or the gateway did not receive exactly the delivery ids it should.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
preset=${BACKHAUL_PRESET:-dev}
bash "$root/packaging/scripts/build.sh" "$preset" backhauld backhaul backhaul-sandbox \
  backhaul_connector_github backhaul_connector_vercel

bin="$root/build/$preset/bin"
plugins="$root/build/$preset/plugins"
work=$(mktemp -d -t backhaul-demo.XXXXXX)
sandbox_pid=""
daemon_pid=""
# True while PID, a child of this script, runs: a zombie, ended but not yet waited for, does not,
# nor does a process that took the PID over once bash reaped ours (its parent is not this script).
running() {
  local stat fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  read -r -a fields <<<"${stat##*) }"  # state, parent, ...
  [ "${fields[0]}" != Z ] && [ "${fields[1]}" = $$ ]
}
# stop PID: SIGTERM, up to 90 s for it to end (then SIGKILL); returns its exit status.
stop() {
  [ -n "$1" ] || return 0
  if running "$1"; then kill -TERM "$1" 2>/dev/null || true; fi
  local deadline=$((SECONDS + 90))
  while running "$1" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if running "$1"; then
    echo "demo: process $1 did not end within 90 s of SIGTERM; killing it" >&2
    kill -KILL "$1" 2>/dev/null || true
  fi
  local rc=0
  wait "$1" 2>/dev/null || rc=$?
  return "$rc"
}
cleanup() {
  local rc=$?
  stop "$daemon_pid" || true
  stop "$sandbox_pid" || true
  if [ "$rc" -ne 0 ]; then  # what went wrong, before the logs go with $work
    for log in "$work/backhauld.log" "$work/sandbox.log"; do
      [ -s "$log" ] || continue
      echo "demo: the last lines of $(basename "$log"):" >&2
      tail -n 40 "$log" >&2
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

wait_for_port() {  # wait_for_port FILE PID LOG
  for _ in $(seq 1 200); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { cat "$3" >&2; return 1; }
    sleep 0.05
  done
  echo "demo: no port in $1" >&2
  cat "$3" >&2
  return 1
}

"$bin/backhaul-sandbox" --port 0 --port-file "$work/sandbox.port" --installations 1 --repos 3 \
  --projects 2 --items 250 --seed 7 >"$work/sandbox.log" 2>&1 &  # keep in step with repos= below
sandbox_pid=$!
wait_for_port "$work/sandbox.port" "$sandbox_pid" "$work/sandbox.log"
url="http://127.0.0.1:$(cat "$work/sandbox.port")"
echo "demo: sandbox at $url (3 repositories x 3 entity types, 2 Vercel projects, 250 items each)"

# A connector author's check first: page through every resource with each plugin directly
# (`backhaul fetch`, no daemon, nothing delivered) and compare the counts with the data set.
repos=3 projects=2 items=250
for provider in github vercel; do
  case $provider in
    github) connection=gh-inst-1 expected=$((repos * 3 * items)) ;;
    vercel) connection=vc-inst-1 expected=$((projects * items)) ;;
  esac
  echo "demo: backhaul fetch --plugin $provider --connection $connection --all-resources"
  line=$("$bin/backhaul" fetch --plugin "$provider" --plugin-dir "$plugins" \
    --base-url "$url/$provider" --gateway "$url/gateway" --connection "$connection" \
    --all-resources --depth 30 --quiet)
  echo "$line"
  events=$(echo "$line" | sed -n 's/.* events=\([0-9]*\).*/\1/p')
  if [ "$events" != "$expected" ]; then
    echo "demo: $provider fetched $events events, the data set has $expected" >&2
    exit 1
  fi
done
echo

cat >"$work/backhauld.json" <<EOF
{
  "store": {"backend": "sqlite", "path": "backhaul.db"},
  "plugins": {
    "directories": ["$plugins"],
    "connectors": {
      "github": {"base_url": "$url/github"},
      "vercel": {"base_url": "$url/vercel"}
    }
  },
  "gateway": {"url": "$url/gateway"},
  "admin": {"port": 0, "token_env": "BACKHAUL_ADMIN_TOKEN", "audit_log": "audit.log"},
  "logging": {"level": "warn"}
}
EOF
BACKHAUL_ADMIN_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export BACKHAUL_ADMIN_TOKEN
"$bin/backhauld" --config "$work/backhauld.json" --port-file "$work/daemon.port" \
  >"$work/backhauld.log" 2>&1 &
daemon_pid=$!
wait_for_port "$work/daemon.port" "$daemon_pid" "$work/backhauld.log"
BACKHAUL_URL="http://127.0.0.1:$(cat "$work/daemon.port")"
export BACKHAUL_URL
echo "demo: backhauld at $BACKHAUL_URL (store $work/backhaul.db)"

echo
echo "demo: backhaul run start --installation gh-inst-1 --provider github"
github_run=$("$bin/backhaul" run start --installation gh-inst-1 --provider github --depth 30 \
  --json | sed -n 's/.*"runId": *\([0-9]*\).*/\1/p')
echo "demo: backhaul run start --installation vc-inst-1 --provider vercel"
vercel_run=$("$bin/backhaul" run start --installation vc-inst-1 --provider vercel --depth 30 \
  --json | sed -n 's/.*"runId": *\([0-9]*\).*/\1/p')
[ -n "$github_run" ] && [ -n "$vercel_run" ] || { echo "demo: a run did not start" >&2; exit 1; }

status=0
for run in "$github_run" "$vercel_run"; do
  echo
  echo "demo: backhaul run status $run --wait"
  # --foreground: a Ctrl-C reaches the command (timeout's own process group would keep it out).
  rc=0
  timeout --foreground 600 "$bin/backhaul" run status "$run" --wait --interval-ms 250 || rc=$?
  [ "$rc" -ne 130 ] || exit 130
  [ "$rc" -eq 0 ] || status=1
done

echo
echo "demo: what the gateway received"
"$bin/backhaul-sandbox" report --url "$url" --require-exactly-once || status=1

daemon_rc=0
stop "$daemon_pid" || daemon_rc=$?
daemon_pid=""
if [ "$daemon_rc" -ne 0 ]; then
  echo "demo: backhauld exited with status $daemon_rc" >&2
  tail -n 40 "$work/backhauld.log" >&2
  status=1
fi
[ "$status" -eq 0 ] && echo "demo: both runs succeeded and the gateway has every event exactly once"
exit "$status"
