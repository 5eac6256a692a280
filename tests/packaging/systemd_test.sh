#!/usr/bin/env bash
# The .deb under a real systemd: a container (systemd-nspawn, its own network) is booted from an
# overlay of this machine's root, so that it has this machine's libraries and nothing it does
# reaches this machine. In it, check_in_container.sh installs the package, starts the hardened
# unit, backfills the sandbox through it (plugins in process, then in workers), upgrades, stops,
# removes and purges it, and writes what it saw to results.txt, which is judged here.
#   systemd_test.sh <cpack> <this build's directory> <backhaul-sandbox> <source directory>
# Needs root (mounts, a container) and systemd-nspawn (packaging/scripts/deps.sh installs it).
set -euo pipefail
cpack=$1
build_dir=$2
sandbox=$3
source_dir=$4

fail() {
  echo "systemd: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || fail "must run as root (it mounts an overlay and boots a container)"
command -v systemd-nspawn >/dev/null || fail "no systemd-nspawn (package systemd-container)"

work=$(mktemp -d -t backhaul-systemd.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/pkg" "$work/out" "$work/root" "$work/layers"
"$cpack" -G DEB --config "$build_dir/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; fail "cpack failed"; }
deb=$(ls "$work"/pkg/backhaul_*.deb)

# Boots into a target of its own: basic.target and the check, none of this machine's services.
cat >"$work/backhaul-check.target" <<'EOF'
[Unit]
Description=Backhaul package check
Requires=basic.target backhaul-check.service
After=basic.target
AllowIsolate=yes
EOF
cat >"$work/backhaul-check.service" <<'EOF'
[Unit]
Description=Backhaul package check (tests/packaging/check_in_container.sh)
After=basic.target
[Service]
Type=oneshot
ExecStart=/check.sh /pkg/backhaul.deb
EOF

# A mount namespace of its own: the overlay goes when it ends, whatever happens.
unshare --mount --propagation private bash -euo pipefail -c '
  work=$1 deb=$2 sandbox=$3 check=$4
  mount -t tmpfs tmpfs "$work/layers"
  mkdir "$work/layers/upper" "$work/layers/work"
  mount -t overlay overlay \
    -o "lowerdir=/,upperdir=$work/layers/upper,workdir=$work/layers/work" "$work/root"
  cp "$work/backhaul-check.target" "$work/backhaul-check.service" "$work/root/etc/systemd/system/"
  exec timeout 300 systemd-nspawn -D "$work/root" --register=no --keep-unit --quiet \
    --private-network --bind-ro="$deb:/pkg/backhaul.deb" --bind-ro="$check:/check.sh" \
    --bind-ro="$sandbox:/sandbox" --bind="$work/out:/out" \
    --boot systemd.unit=backhaul-check.target
' _ "$work" "$deb" "$sandbox" "$source_dir/tests/packaging/check_in_container.sh" \
  >"$work/nspawn.log" 2>&1 || { tail -40 "$work/nspawn.log" >&2; fail "the container did not boot and power off"; }

[ -f "$work/out/results.txt" ] ||
  { tail -40 "$work/nspawn.log" >&2; fail "the check in the container wrote no results"; }
expect() {
  local key=$1 want=$2 got
  got=$(sed -n "s/^$key=//p" "$work/out/results.txt" | tail -1)
  [ "$got" = "$want" ] || {
    tail -60 "$work/out/check.log" >&2
    fail "$key is '$got', expected '$want' (results: $(tr '\n' ' ' <"$work/out/results.txt"))"
  }
}
expect installed 0
expect active active
expect dynamic_user yes
expect no_new_privs 1
expect seccomp 2
expect capabilities 0000000000000000
expect github_in_process 0
expect vercel_in_process 0
expect workers_running 2
expect workers_of_another_user 0
expect github_in_workers 0
expect vercel_in_workers 0
expect gateway_complete 0
expect restarted_by_upgrade 1
expect enabled_after_upgrade enabled
expect stop_result success
expect stop_status 0
expect load_state_after_remove masked
expect configuration_after_purge gone
expect store_after_purge kept
expect finished yes
echo "systemd: the .deb installs, serves a backfill under its hardened unit, upgrades, stops," \
  "removes and purges under systemd $(systemd-nspawn --version | head -1 | cut -d' ' -f2)"
