#!/usr/bin/env bash
# Installs Backhaul's build and test dependencies from Debian 12's own packages.
# Idempotent: when every package is already present it does nothing (no apt-get update).
set -euo pipefail

# dpkg-dev, systemd, systemd-container: the tests of the packages (cpack's dpkg-shlibdeps,
# systemd-analyze, a container booted with systemd-nspawn).
packages=(
  g++ cmake ninja-build pkg-config make file binutils openssl ca-certificates procps
  libpoco-dev libboost-dev libboost-filesystem-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libssl-dev libsqlite3-dev
  mariadb-server mariadb-client clang-format wrk dpkg-dev systemd systemd-container
)

# One run of this script at a time (the demo and the tests started together, say): a second
# waits, then finds what the first installed. (apt does not inherit the lock's descriptor: a
# service a package left running would hold it for ever.) Without it, each took the other's policy-rc.d below
# for one left by a killed run and removed it while the other's apt was installing.
policy=/usr/sbin/policy-rc.d
marker="# written by backhaul's packaging/scripts/deps.sh"
if [ "$(id -u)" -eq 0 ]; then
  mkdir -p /run/lock
  exec 9>/run/lock/backhaul-deps.lock
  flock 9
  # What this script writes to keep services from starting (below). One found here, under the
  # lock, is left from a run that was killed before it could remove it: it goes now, since
  # otherwise every later run would take it for the machine's own policy and keep it for good.
  if [ -f "$policy" ] && grep -qxF "$marker" "$policy"; then
    rm -f "$policy"
  fi
fi

# A package installed for two architectures (multiarch) prints its status once per architecture.
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null || true)
  grep -qx installed <<<"$status" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages (${missing[*]}); run as root or install them" >&2
  exit 1
fi

# apt-get with its locks waited for: DPkg::Lock::Timeout covers dpkg's lock, but `update` (the
# lists' lock), which a fresh machine's own apt timers may hold at boot, gives up at once. Such a
# failure is tried again every 10 s for up to 10 minutes; any other fails at once, with apt's
# words.
apt_get() {
  local out deadline=$((SECONDS + 600))
  while :; do
    # No terminal to ask on (a question would wait for ever, unseen, with the output held here):
    # a changed configuration file keeps the machine's version.
    if out=$(LC_ALL=C apt-get -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef \
      -o Dpkg::Options::=--force-confold "$@" 2>&1 </dev/null 9>&-); then
      return 0
    fi
    if ! grep -q "Could not get lock" <<<"$out" || [ $SECONDS -ge $deadline ]; then
      echo "$out" >&2
      echo "deps: apt-get $1 failed" >&2
      return 1
    fi
    echo "deps: apt is busy (another apt or dpkg holds its lock); trying again in 10 s" >&2
    sleep 10
  done
}

echo "deps: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages such as mariadb-server start a system service when installed. The tests start their own
# private server, so keep the package from starting one (policy-rc.d 101 = "not allowed"), unless
# the machine already has a policy of its own.
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n%s\nexit 101\n' "$marker" >"$policy"
  chmod +x "$policy"
  own_policy=1
fi
trap '[ "$own_policy" = 1 ] && rm -f "$policy"' EXIT
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}"
