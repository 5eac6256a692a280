#!/usr/bin/env bash
# SPEC I1 as an operator meets it: cpack makes the packages of this build; dpkg installs the two
# .deb into a root of their own (maintainer scripts included), and the installed daemon, CLI,
# worker and plugins run from there against the system's libraries; the systemd unit passes
# systemd's own checks; the .tar.gz unpacks into one directory and runs from it.
#   package_test.sh <cpack> <this build's directory> <source directory>
set -euo pipefail
cpack=$1
build_dir=$2
source_dir=$3
work=$(mktemp -d)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -KILL "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "package: $*" >&2
  exit 1
}

version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build_dir/CPackConfig.cmake")
arch=$(dpkg --print-architecture)
[ -n "$version" ] || fail "no CPACK_PACKAGE_VERSION in $build_dir/CPackConfig.cmake"
"$cpack" --config "$build_dir/CPackConfig.cmake" -B "$work/out" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; fail "cpack failed"; }
deb="$work/out/backhaul_${version}-1_${arch}.deb"
dev="$work/out/backhaul-dev_${version}-1_all.deb"
tgz="$work/out/backhaul-${version}-Linux.tar.gz"
for f in "$deb" "$dev" "$tgz"; do
  [ -f "$f" ] || fail "cpack made no $(basename "$f"): $(ls "$work/out")"
  (cd "$work/out" && sha256sum --quiet -c "$(basename "$f").sha256") || fail "$f: bad checksum"
done

# What each package holds: exactly these files (directories aside).
files_of_deb() { dpkg-deb -c "$1" | awk '$1 !~ /^d/ {print $6}' | sort; }
expect_files() {
  local what=$1 actual=$2 expected
  expected=$(sort)
  [ "$actual" = "$expected" ] ||
    fail "$what holds other files than expected:"$'\n'"$(diff <(echo "$expected") <(echo "$actual"))"
}
expect_files "$(basename "$deb")" "$(files_of_deb "$deb")" <<'EOF'
./usr/bin/backhaul
./usr/bin/backhaul-plugin-worker
./usr/bin/backhauld
./usr/lib/backhaul/plugins/github.so
./usr/lib/backhaul/plugins/vercel.so
./usr/lib/systemd/system/backhauld.service
./usr/share/backhaul/backhauld.example.env
./usr/share/backhaul/backhauld.example.json
./usr/share/backhaul/schemas/config.schema.json
./usr/share/backhaul/schemas/openapi.yaml
./usr/share/backhaul/schemas/validate-report.schema.json
./usr/share/doc/backhaul/README.md
./usr/share/doc/backhaul/architecture.md
./usr/share/doc/backhaul/daemon.md
./usr/share/doc/backhaul/plugin-validate.md
EOF
sdk_files=$(cd "$source_dir/sdk/include" && find backhaul -type f | sed 's|^|./usr/include/|')
template_files=$(cd "$source_dir/packaging/connector-template" && find . -type f |
  sed 's|^\./|./usr/share/backhaul/connector-template/|')
expect_files "$(basename "$dev")" "$(files_of_deb "$dev")" <<EOF
$sdk_files
$template_files
./usr/lib/cmake/BackhaulSDK/BackhaulConnector.cmake
./usr/lib/cmake/BackhaulSDK/BackhaulSDKConfig.cmake
./usr/lib/cmake/BackhaulSDK/BackhaulSDKConfigVersion.cmake
./usr/lib/cmake/BackhaulSDK/BackhaulSDKTargets.cmake
./usr/share/pkgconfig/backhaul-sdk.pc
EOF

# The control fields: names, and dependencies that this machine's packages satisfy (they come
# from dpkg-shlibdeps: a library that no package provides would leave them short).
[ "$(dpkg-deb -f "$deb" Package Version Architecture)" = \
  "Package: backhaul"$'\n'"Version: ${version}-1"$'\n'"Architecture: $arch" ] ||
  fail "backhaul's control fields: $(dpkg-deb -f "$deb" Package Version Architecture)"
[ "$(dpkg-deb -f "$dev" Package Architecture)" = "Package: backhaul-dev"$'\n'"Architecture: all" ] ||
  fail "backhaul-dev's control fields: $(dpkg-deb -f "$dev" Package Architecture)"
depends=$(dpkg-deb -f "$deb" Depends)
for library in libpoconet libpocodatasqlite libspdlog libmariadb libstdc++6; do
  [[ "$depends" == *"$library"* ]] || fail "Depends names no $library: $depends"
done
while read -r dependency; do
  name=${dependency%% *}
  installed=$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null) ||
    fail "Depends names $name, which is not installed here"
  if [[ "$dependency" =~ \((.+)\ (.+)\) ]]; then
    dpkg --compare-versions "$installed" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" ||
      fail "Depends asks for $dependency; this machine has $name $installed"
  fi
done < <(echo "$depends" | tr ',' '\n' | sed 's/^ *//')

# Install both into a root of their own, as dpkg does: the maintainer scripts run too, with
# $DPKG_ROOT pointing there (the libraries they need are the system's, so --force-depends).
root="$work/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
touch "$root/var/lib/dpkg/status"
dpkg_root() {
  local force=--force-script-chrootless,depends
  [ "$(id -u)" -eq 0 ] || force+=,not-root
  dpkg --root="$root" --log=/dev/null "$force" "$@" >>"$work/dpkg.log" 2>&1 ||
    { cat "$work/dpkg.log" >&2; fail "dpkg $* failed"; }
}
dpkg_root -i "$deb" "$dev"
etc="$root/etc/backhaul"
[ "$(stat -c %a "$etc/backhauld.json")" = 644 ] || fail "postinst made no $etc/backhauld.json"
[ "$(stat -c %a "$etc/backhauld.env")" = 600 ] ||
  fail "the secrets' file is not mode 0600: $(stat -c %a "$etc/backhauld.env" 2>&1)"
cmp -s "$etc/backhauld.json" "$source_dir/packaging/config/backhauld.json" ||
  fail "$etc/backhauld.json is not the example configuration"
# An operator's edits survive an upgrade (the same package installed again).
echo '{"edited": true}' >"$etc/backhauld.json"
dpkg_root -i "$deb"
[ "$(cat "$etc/backhauld.json")" = '{"edited": true}' ] || fail "reinstalling replaced the configuration"
# And one who removed it is not given it back.
rm "$etc/backhauld.json"
dpkg_root -i "$deb"
[ ! -e "$etc/backhauld.json" ] || fail "reinstalling put back a configuration the operator removed"
cp "$source_dir/packaging/config/backhauld.json" "$etc/backhauld.json"

# The installed programs: no run path into this build, and they start.
bin="$root/usr/bin"
plugins="$root/usr/lib/backhaul/plugins"
for elf in "$bin"/* "$plugins"/*.so; do
  if readelf -d "$elf" | grep -Eq 'R(UN)?PATH'; then
    fail "$elf keeps a run path: $(readelf -d "$elf" | grep -E 'R(UN)?PATH')"
  fi
done
[ "$("$bin/backhauld" --version)" = "$version" ] || fail "backhauld --version: not $version"
[ "$("$bin/backhaul" --version)" = "$version" ] || fail "backhaul --version: not $version"
# A plugin id is found in the installed plugin directory, beside the installed CLI.
for plugin in github vercel; do
  "$bin/backhaul" plugin info "$plugin" >"$work/info.txt" ||
    fail "backhaul plugin info $plugin failed"
  grep -Eq "^id: +$plugin\$" "$work/info.txt" || fail "plugin info $plugin: $(cat "$work/info.txt")"
  grep -Fq "$plugins/$plugin.so" "$work/info.txt" ||
    fail "plugin info $plugin did not load $plugins/$plugin.so: $(cat "$work/info.txt")"
done

# The example configuration, with its paths moved into this root: valid, and both plugins load,
# in the daemon's process and (isolation) in the worker installed beside it.
sed -e "s|/usr/lib/backhaul/plugins|$plugins|" -e "s|/var/lib/backhaul|$work|g" \
  -e "s|/var/log/backhaul|$work|g" \
  "$etc/backhauld.json" >"$work/backhauld.json"
export BACKHAUL_ADMIN_TOKEN=package-test-token BACKHAUL_GATEWAY_API_KEY=package-test-key
# An edit of the example that changes nothing (its text moved on) fails here, not later.
edit() {
  local file=$1 expression=$2 out=$3
  sed "$expression" "$file" >"$out"
  ! cmp -s "$file" "$out" || fail "sed '$expression' changed nothing in $file"
}
check_config() {
  local config=$1 where=$2
  "$bin/backhauld" --config "$config" --check-config >"$work/check.txt" 2>"$work/check.log" ||
    { cat "$work/check.txt" "$work/check.log" >&2; fail "backhauld --check-config $config failed"; }
  [ "$(cat "$work/check.txt")" = "config: $config is valid" ] ||
    fail "backhauld --check-config $config: $(cat "$work/check.txt")"
  for plugin in github vercel; do
    grep -q "loaded plugin $plugin .* from $plugins/$plugin.so$where" "$work/check.log" ||
      fail "backhauld --check-config $config did not load $plugin.so$where: $(cat "$work/check.log")"
  done
}
check_config "$work/backhauld.json" '"'
edit "$work/backhauld.json" 's|"plugins": {|"plugins": {"isolation": {"mode": "process"},|' \
  "$work/isolated.json"
check_config "$work/isolated.json" ' in a worker process"'

# The installed daemon serves, the installed CLI talks to it, and SIGTERM stops it with status 0.
edit "$work/backhauld.json" 's|"port": 8470|"port": 0|' "$work/serve.json"
"$bin/backhauld" --config "$work/serve.json" --port-file "$work/port" >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 300); do
  [ -s "$work/port" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/daemon.log" >&2; fail "backhauld ended at start"; }
  sleep 0.1
done
[ -s "$work/port" ] || { cat "$work/daemon.log" >&2; fail "backhauld wrote no port in 30 s"; }
runs=$("$bin/backhaul" run list --url "http://127.0.0.1:$(cat "$work/port")" --json) ||
  fail "backhaul run list against the installed daemon failed"
[[ "$runs" == *'"items"'* ]] || fail "backhaul run list --json: $runs"
kill -TERM "$daemon_pid"
for _ in $(seq 1 600); do
  kill -0 "$daemon_pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$daemon_pid" 2>/dev/null && { cat "$work/daemon.log" >&2; fail "backhauld still runs 60 s after SIGTERM"; }
status=0
wait "$daemon_pid" || status=$?
daemon_pid=
[ "$status" -eq 0 ] || { cat "$work/daemon.log" >&2; fail "backhauld exited $status after SIGTERM"; }
[ -f "$work/backhaul.db" ] || fail "the daemon made no store at $work/backhaul.db"
[ -f "$work/audit.log" ] || fail "the daemon opened no audit log at $work/audit.log"

# The unit: systemd reads every line of it (an unknown or misspelt key is only a warning there,
# so any output fails), and its sandbox rates "OK" (exposure at most 2.0 of 10).
unit="$root/usr/lib/systemd/system/backhauld.service"
sed "s|=/usr/bin/backhauld|=$bin/backhauld|" "$unit" >"$work/backhauld.service"
verify=$(cd "$work" && systemd-analyze verify --man=no backhauld.service 2>&1) ||
  fail "systemd-analyze verify: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify: $verify"
(cd "$work" && systemd-analyze security --offline=true --threshold=20 backhauld.service \
  >"$work/security.txt" 2>&1) ||
  { cat "$work/security.txt" >&2; fail "the unit's exposure is over 2.0"; }
echo "package: unit $(grep -o 'Overall exposure level.*' "$work/security.txt")"

# A purge removes the configuration postinst made (and no more).
dpkg_root -P backhaul
[ ! -e "$etc/backhauld.json" ] && [ ! -e "$etc/backhauld.env" ] ||
  fail "purging left the configuration: $(ls "$etc")"
[ ! -e "$bin/backhauld" ] || fail "purging left $bin/backhauld"

# The archive: one top directory, both components, and it runs from wherever it is unpacked.
top="backhaul-${version}-Linux"
others=$(tar tzf "$tgz" | grep -v "^$top/" || true)
[ -z "$others" ] || fail "$(basename "$tgz") holds paths outside $top/: $others"
mkdir "$work/unpacked"
tar xzf "$tgz" -C "$work/unpacked"
home="$work/unpacked/$top"
for f in bin/backhauld bin/backhaul-plugin-worker include/backhaul/backhaul.h \
  lib/cmake/BackhaulSDK/BackhaulSDKConfig.cmake lib/backhaul/plugins/github.so; do
  [ -f "$home/$f" ] || fail "$(basename "$tgz") has no $f"
done
# (Each child gets a minute: parsing fault_huge_body's 50 MB takes seconds under the sanitizers.)
"$home/bin/backhaul" plugin validate vercel --timeout-ms 60000 \
  --fixtures "$source_dir/tests/fixtures/validate/vercel" >"$work/validate.txt" 2>&1 ||
  { grep -v '^PASS' "$work/validate.txt" >&2; fail "the archive's vercel.so failed validation"; }
echo "package: $(basename "$deb"), $(basename "$dev") and $(basename "$tgz") install and run"
