#!/usr/bin/env bash
# Runs in the container that systemd_test.sh boots, as a oneshot unit, with systemd as PID 1.
# Writes key=value lines to /out/results.txt (judged by systemd_test.sh) and its trace to
# /out/check.log, then powers the container off, whatever happened.
#   check_in_container.sh <the backhaul .deb>
deb=$1
exec >/out/check.log 2>&1
trap 'echo finished=yes >>/out/results.txt; systemctl --no-block poweroff' EXIT
set -x
result() { echo "$1=$2" >>/out/results.txt; }

# A machine of this kind may forbid starting services from packages (policy-rc.d exits 101, as in
# Docker images); this one is the container's own, which needs them started.
rm -f /usr/sbin/policy-rc.d
dpkg -i "$deb"
result installed $?

/sandbox --port 18080 --installations 1 --repos 2 --projects 1 --items 120 --seed 5 \
  >/out/sandbox.log 2>&1 &
url=http://127.0.0.1:18080
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
printf 'BACKHAUL_ADMIN_TOKEN=%s\nBACKHAUL_GATEWAY_API_KEY=unused\n' "$token" >/etc/backhaul/backhauld.env
sed -i -e "s|\"https://gateway.example.com\"|\"$url/gateway\"|" \
  -e "s|\"base_url\": \"https://api.github.com\"}, \"vercel\": {}|\"base_url\": \"$url/github\"}, \"vercel\": {\"base_url\": \"$url/vercel\"}|" \
  /etc/backhaul/backhauld.json
cat /etc/backhaul/backhauld.json
export BACKHAUL_ADMIN_TOKEN=$token BACKHAUL_URL=http://127.0.0.1:8470

wait_for_api() {
  for _ in $(seq 1 100); do
    backhaul run list >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}
# One run per connector; the status of `backhaul run status --wait` (0: succeeded).
backfill() {
  local provider=$1 installation=$2 run
  run=$(backhaul run start --installation "$installation" --provider "$provider" --depth 30 \
    --json | sed -n 's/.*"runId": *\([0-9]*\).*/\1/p')
  [ -n "$run" ] || return 9
  timeout 120 backhaul run status "$run" --wait --interval-ms 250
}

systemctl enable --now backhauld
wait_for_api
result active "$(systemctl show backhauld -p ActiveState --value)"
result dynamic_user "$(systemctl show backhauld -p DynamicUser --value)"
pid=$(systemctl show backhauld -p MainPID --value)
result no_new_privs "$(sed -n 's/^NoNewPrivs:\t//p' /proc/"$pid"/status)"
result seccomp "$(sed -n 's/^Seccomp:\t//p' /proc/"$pid"/status)"
result capabilities "$(sed -n 's/^CapEff:\t//p' /proc/"$pid"/status)"
backfill github gh-inst-1
result github_in_process $?
backfill vercel vc-inst-1
result vercel_in_process $?

# The plugins in workers: fork, exec and the sealed copies, under the same filter.
sed -i 's|"plugins": {|"plugins": {"isolation": {"mode": "process"},|' /etc/backhaul/backhauld.json
systemctl restart backhauld
wait_for_api
pid=$(systemctl show backhauld -p MainPID --value)
result workers_running "$(pgrep -c -P "$pid" -f backhaul-plugin-worker)"
result workers_of_another_user "$(ps -o uid= --ppid "$pid" | grep -cvx " *$(ps -o uid= -p "$pid" | tr -d ' ')")"
backfill github gh-inst-1
result github_in_workers $?
backfill vercel vc-inst-1
result vercel_in_workers $?
/sandbox report --url "$url" --require-complete
result gateway_complete $?

# An upgrade (the same version again) restarts the running daemon and keeps it enabled.
dpkg -i "$deb"
sleep 1
wait_for_api
[ "$(systemctl show backhauld -p MainPID --value)" != "$pid" ] && restarted=1 || restarted=0
result restarted_by_upgrade "$restarted"
result enabled_after_upgrade "$(systemctl is-enabled backhauld)"

systemctl stop backhauld
result stop_result "$(systemctl show backhauld -p Result --value)"
result stop_status "$(systemctl show backhauld -p ExecMainStatus --value)"

dpkg -r backhaul
result load_state_after_remove "$(systemctl show backhauld -p LoadState --value)"
dpkg -P backhaul
[ -e /etc/backhaul ] && result configuration_after_purge kept || result configuration_after_purge gone
[ -f /var/lib/private/backhaul/backhaul.db ] && result store_after_purge kept ||
  result store_after_purge gone
