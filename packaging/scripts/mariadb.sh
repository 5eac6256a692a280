#!/usr/bin/env bash
# A private, throwaway MariaDB server for the MySQL tests (loopback only, no systemd, no my.cnf).
#
# Usage: packaging/scripts/mariadb.sh start|stop|status|env DIR
#
#   start   Creates a fresh data directory under DIR, starts mariadbd on 127.0.0.1 on a free port,
#           creates the database `backhaul_test`, a test user and an admin user, and writes
#             DIR/connection.txt       Poco-style connection string of the test user (db=backhaul_test)
#             DIR/root_connection.txt  the admin user's (no db), for tests that create databases
#             DIR/mysqld.pid           the PID of the mariadbd it started
#           If a server started from DIR is still running, it is reused. If the server cannot
#           start, prints the tail of its error log and exits non-zero.
#   stop    Stops the server started from DIR, by its PID only (mariadb-admin shutdown through its
#           socket, then waits for that PID; TERM at once if the shutdown is refused, as by a
#           server still starting, and KILL that PID if it will not exit). Starts and stops of
#           one DIR take turns (a lock in DIR).
#   status  Exits 0 when the server started from DIR is running.
#   env     Prints `export BACKHAUL_TEST_MYSQL=...` and `export BACKHAUL_TEST_MYSQL_ROOT=...`.
#
# BACKHAUL_MARIADB_PORT=N makes start try port N first (then random free ones, as always).
#
# Never kills by name: other MariaDB servers on the machine are left alone.
set -euo pipefail
# Debian keeps mariadbd in /usr/sbin, which a user's PATH (or root's after a plain su) may lack.
PATH=$PATH:/usr/sbin:/sbin

usage() {
  echo "usage: $0 start|stop|status|env DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
action=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)

datadir="$dir/data"
pidfile="$dir/mysqld.pid"
errlog="$dir/mysqld.err"
conn_file="$dir/connection.txt"
root_conn_file="$dir/root_connection.txt"
sock_file="$dir/socket.txt"
port_file="$dir/port.txt"

# The Unix socket path must fit sun_path (108 bytes); fall back to a short private directory.
socket_path() {
  if [ -s "$sock_file" ]; then
    cat "$sock_file"
    return
  fi
  local s="$dir/mysqld.sock"
  if [ ${#s} -gt 100 ]; then
    s="$(mktemp -d -t backhaul-mariadb.XXXXXX)/mysqld.sock"
  fi
  echo "$s" >"$sock_file"
  echo "$s"
}

# True when the PID in $pidfile is alive and is a mariadbd serving $datadir (guards PID reuse).
running_pid() {
  [ -s "$pidfile" ] || return 1
  local pid
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--datadir=$datadir" || return 1
  echo "$pid"
}

admin() { mariadb-admin --no-defaults --socket="$(socket_path)" -uroot "$@"; }
sql() { mariadb --no-defaults --socket="$(socket_path)" -uroot --batch --skip-column-names "$@"; }

show_log() {
  local f
  for f in "$errlog" "$dir/mysqld.out"; do
    if [ -s "$f" ]; then
      echo "mariadb.sh: last lines of $f:" >&2
      tail -n 30 "$f" >&2
    fi
  done
}

wait_exit() {  # wait_exit PID SECONDS -> 0 when PID is gone (or a zombie: a child of ours ended)
  local pid=$1 deadline=$((SECONDS + $2)) stat
  while kill -0 "$pid" 2>/dev/null; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    [ "${stat%% *}" != Z ] || return 0
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.05
  done
}

random_secret() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

do_stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$pidfile"
    remove_socket_dir
    echo "mariadb.sh: no server running for $dir"
    return 0
  fi
  # mariadb-admin returns before mariadbd has exited: always wait on the PID. A server that has
  # no socket yet (still starting) refuses the shutdown: it gets TERM (a clean shutdown for
  # mariadbd) at once rather than after the minute a shutdown may take. mariadb-admin outlives a
  # TERM while it waits for a server that does not answer (stopped, wedged): KILL 5 s later.
  local term=1
  if timeout -k 5 30 mariadb-admin --no-defaults --socket="$(socket_path)" -uroot shutdown \
    >/dev/null 2>&1; then
    if wait_exit "$pid" 60; then
      term=0
    else
      echo "mariadb.sh: server $pid did not stop after shutdown; sending TERM" >&2
    fi
  fi
  if [ $term = 1 ]; then
    kill -TERM "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true  # a stopped server acts on TERM only once continued
    if ! wait_exit "$pid" 30; then
      echo "mariadb.sh: server $pid ignored TERM; sending KILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      wait_exit "$pid" 10 || { echo "mariadb.sh: server $pid will not exit" >&2; return 1; }
    fi
  fi
  rm -f "$pidfile"
  remove_socket_dir
  echo "mariadb.sh: stopped server $pid"
}

# The short private directory socket_path() made for the socket under the temporary directory, if
# it made one (and not DIR itself, whatever its name).
remove_socket_dir() {
  [ -s "$sock_file" ] || return 0
  local d tmp
  d=$(dirname "$(cat "$sock_file")")
  tmp=$(cd "${TMPDIR:-/tmp}" 2>/dev/null && pwd) || tmp=""
  if [ "$d" != "$dir" ] && [ "$(dirname "$d")" = "$tmp" ]; then
    case "$(basename "$d")" in
      backhaul-mariadb.*) rm -rf "$d" ;;
    esac
  fi
  rm -f "$sock_file"
}

# Starts mariadbd on `port`; returns 0 when it answers pings, 3 when the port was taken, 1 else.
try_start() {
  local port=$1 sock pid deadline
  sock=$(socket_path)
  rm -f "$sock" "$errlog"
  local user_opt=()
  [ "$(id -u)" -eq 0 ] && user_opt=(--user=root)
  # setsid + redirected stdio: the server must not keep the caller's (ctest's) pipes open, nor
  # the lock (fd 8). The server's own process writes its PID file before it becomes mariadbd: a
  # start killed just after the fork still leaves the PID of the server it started, in a session
  # of its own, for stop to find.
  setsid bash -c 'echo $$ >"$0" && exec "$@"' "$pidfile" \
    mariadbd --no-defaults --datadir="$datadir" --socket="$sock" --port="$port" \
    --bind-address=127.0.0.1 "${user_opt[@]}" --pid-file="$dir/mariadbd-own.pid" \
    --log-error="$errlog" --skip-name-resolve --skip-log-bin \
    --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
    --innodb-buffer-pool-size=128M --innodb-log-file-size=96M \
    --innodb-flush-log-at-trx-commit=1 --max-connections=512 --max-allowed-packet=64M \
    </dev/null >"$dir/mysqld.out" 2>&1 8>&- &
  pid=$!
  echo "$pid" >"$pidfile"
  deadline=$((SECONDS + 60))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
      rm -f "$pidfile"
      if grep -qiE "address already in use|errno: 98|error: 98" "$errlog" 2>/dev/null; then
        return 3
      fi
      return 1
    fi
    if admin ping >/dev/null 2>&1; then
      echo "$port" >"$port_file"
      return 0
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "mariadb.sh: server $pid not ready after 60 s" >&2
      do_stop >/dev/null 2>&1 || true
      return 1
    fi
    sleep 0.05
  done
}

do_start() {
  local pid
  if pid=$(running_pid); then
    # A start cut short after the server came up has not written the connection files, and a
    # server may be alive but not answering (stopped, wedged): neither is reused, but started
    # afresh.
    if ! [ -s "$conn_file" ] || ! [ -s "$root_conn_file" ]; then
      echo "mariadb.sh: server $pid has no connection files (an earlier start was cut short);" \
        "starting afresh" >&2
    elif ! timeout -k 5 15 mariadb-admin --no-defaults --socket="$(socket_path)" -uroot \
      --connect-timeout=5 ping >/dev/null 2>&1; then
      echo "mariadb.sh: server $pid does not answer a ping; starting afresh" >&2
    else
      echo "mariadb.sh: reusing server $pid (connection in $conn_file)"
      return 0
    fi
    do_stop >&2
  fi
  for tool in mariadb-install-db mariadbd mariadb-admin mariadb; do
    command -v "$tool" >/dev/null || { echo "mariadb.sh: $tool not found (install mariadb-server)" >&2; exit 1; }
  done
  remove_socket_dir
  rm -rf "$datadir" "$conn_file" "$root_conn_file" "$port_file"
  local user_opt=()
  [ "$(id -u)" -eq 0 ] && user_opt=(--user=root)
  if ! mariadb-install-db --no-defaults --datadir="$datadir" "${user_opt[@]}" \
      --auth-root-authentication-method=normal --skip-test-db >"$dir/install-db.log" 2>&1; then
    echo "mariadb.sh: mariadb-install-db failed:" >&2
    tail -n 30 "$dir/install-db.log" >&2
    exit 1
  fi

  # mariadbd needs a fixed port: try random ports in 20000-39999 until one binds.
  local attempt port rc
  for attempt in $(seq 1 25); do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
    if [ "$attempt" -eq 1 ] && [ -n "${BACKHAUL_MARIADB_PORT:-}" ]; then port=$BACKHAUL_MARIADB_PORT; fi
    rc=0
    try_start "$port" || rc=$?
    [ $rc -eq 0 ] && break
    [ $rc -eq 3 ] && echo "mariadb.sh: port $port is taken, trying another" >&2
    if [ $rc -ne 3 ]; then
      echo "mariadb.sh: mariadbd failed to start" >&2
      show_log
      exit 1
    fi
  done
  if [ $rc -ne 0 ]; then
    echo "mariadb.sh: no free port found after $attempt attempts" >&2
    show_log
    exit 1
  fi

  local pw admin_pw
  pw=$(random_secret)
  admin_pw=$(random_secret)
  if ! sql -e "
      CREATE DATABASE backhaul_test CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
      CREATE USER 'backhaul'@'127.0.0.1' IDENTIFIED BY '$pw';
      GRANT ALL PRIVILEGES ON \`backhaul\\_%\`.* TO 'backhaul'@'127.0.0.1';
      CREATE USER 'backhaul_admin'@'127.0.0.1' IDENTIFIED BY '$admin_pw';
      GRANT ALL PRIVILEGES ON *.* TO 'backhaul_admin'@'127.0.0.1' WITH GRANT OPTION;" \
      2>"$dir/setup.err"; then
    echo "mariadb.sh: creating the database and users failed:" >&2
    cat "$dir/setup.err" >&2
    do_stop >&2 || true
    exit 1
  fi
  local common="host=127.0.0.1;port=$port"
  echo "$common;db=backhaul_test;user=backhaul;password=$pw;character-set=utf8mb4" >"$conn_file"
  echo "$common;user=backhaul_admin;password=$admin_pw;character-set=utf8mb4" >"$root_conn_file"
  chmod 600 "$conn_file" "$root_conn_file"
  echo "mariadb.sh: server $(cat "$pidfile") ready on 127.0.0.1:$port (connection in $conn_file)"
}

# One start or stop of DIR at a time: a stop while a start runs (a cut-short test run's trap) waits
# for the start to write the PID file, and then stops what it started.
lock() {
  exec 8>"$dir/lock"
  flock 8
}

case "$action" in
  start) lock; do_start ;;
  stop) lock; do_stop ;;
  status)
    if pid=$(running_pid); then
      echo "mariadb.sh: server $pid running on 127.0.0.1:$(cat "$port_file")"
    else
      echo "mariadb.sh: not running" >&2
      exit 1
    fi
    ;;
  env)
    [ -s "$conn_file" ] || { echo "mariadb.sh: no $conn_file (start first)" >&2; exit 1; }
    printf "export BACKHAUL_TEST_MYSQL='%s'\n" "$(cat "$conn_file")"
    printf "export BACKHAUL_TEST_MYSQL_ROOT='%s'\n" "$(cat "$root_conn_file")"
    ;;
  *) usage ;;
esac
