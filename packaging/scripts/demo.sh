#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, starts the sandbox (fake GitHub, Vercel and
# gateway on 127.0.0.1), backfills every repository and project of one installation with the real
# connector plugins, delivers every event to the gateway, and checks that the gateway received
# exactly the delivery IDs it should have. Exits non-zero on any mismatch.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
preset=${BACKHAUL_PRESET:-dev}
bash "$root/packaging/scripts/build.sh" "$preset" backhaul backhaul-sandbox \
  backhaul_connector_github backhaul_connector_vercel

bin="$root/build/$preset/bin"
work=$(mktemp -d)
sandbox_pid=""
cleanup() {
  if [ -n "$sandbox_pid" ] && kill -0 "$sandbox_pid" 2>/dev/null; then
    kill -TERM "$sandbox_pid"
    wait "$sandbox_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/backhaul-sandbox" --port 0 --port-file "$work/port" --installations 1 --repos 3 \
  --projects 2 --items 250 --seed 7 >"$work/sandbox.log" 2>&1 &
sandbox_pid=$!
for _ in $(seq 1 100); do
  [ -s "$work/port" ] && break
  kill -0 "$sandbox_pid" 2>/dev/null || { cat "$work/sandbox.log"; exit 1; }
  sleep 0.05
done
[ -s "$work/port" ] || { echo "demo: sandbox did not start" >&2; cat "$work/sandbox.log"; exit 1; }
url="http://127.0.0.1:$(cat "$work/port")"
echo "demo: sandbox at $url (3 repositories x 3 entity types, 2 Vercel projects, 250 items each)"

for provider in github vercel; do
  case $provider in
    github) connection=gh-inst-1 ;;
    vercel) connection=vc-inst-1 ;;
  esac
  echo
  echo "demo: backhaul fetch --plugin $provider --connection $connection --all-resources --dispatch"
  "$bin/backhaul" fetch --plugin "$provider" --base-url "$url/$provider" \
    --gateway "$url/gateway" --connection "$connection" --all-resources --depth 30 \
    --dispatch --quiet
done

echo
echo "demo: what the gateway received"
"$bin/backhaul-sandbox" report --url "$url" --require-complete
