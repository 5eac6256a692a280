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

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages (${missing[*]}); run as root or install them" >&2
  exit 1
fi

echo "deps: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages such as mariadb-server start a system service when installed. The tests start their own
# private server, so keep the package from starting one (policy-rc.d 101 = "not allowed"), unless
# the machine already has a policy of its own.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  own_policy=1
fi
trap '[ "$own_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
