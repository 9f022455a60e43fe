#!/usr/bin/env bash
# Makes sure the local PostgreSQL 15, Redis 7 and RabbitMQ that Redrive's tests,
# benchmarks and demo use are up on their standard ports (and that Chromium and
# ChromeDriver, which the console's tests drive, and promtool, which tests the alert
# rules in deploy/prometheus/, are installed), starting any that is down with the
# commands of this machine kind (see docs/operating.md, "Local services").
# Installs the ones that are missing when run as root on Debian or Ubuntu, and
# prints the commands otherwise. Never stops or reconfigures a running server.
set -euo pipefail

wait_for() { # what, seconds, command...
  local what=$1 seconds=$2; shift 2
  for _ in $(seq 1 "$seconds"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "services: $what did not come up within ${seconds}s" >&2
  return 1
}

# Missing servers: installed when we are root on Debian or Ubuntu (apt-get),
# else the exact commands are printed and the script stops.
missing=()
command -v pg_isready >/dev/null 2>&1 || missing+=(postgresql postgresql-client)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server redis-tools)
command -v rabbitmq-server >/dev/null 2>&1 || missing+=(rabbitmq-server)
# The console's end-to-end tests drive Debian's headless Chromium over WebDriver.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# The alert rules' tests (tests/tests/alert_rules.rs) run promtool, from Debian's
# prometheus package. Only promtool is wanted: its Prometheus server (port 9090)
# must not start, so the install runs under a policy-rc.d that refuses it.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if ((${#missing[@]})); then
  install="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "services: not installed: ${missing[*]}. On Debian 12 or Ubuntu 22.04+, as root:" >&2
    echo "  $install" >&2
    if [[ " ${missing[*]} " == *" postgresql "* ]]; then
      echo "  then let local TCP connections in without a password (tests connect as postgres@127.0.0.1):" >&2
      echo "  printf 'host all all 127.0.0.1/32 trust\\nhost all all ::1/128 trust\\n' | cat - /etc/postgresql/*/main/pg_hba.conf > /tmp/hba && cp /tmp/hba /etc/postgresql/*/main/pg_hba.conf" >&2
      echo "  pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main reload || true" >&2
    fi
    if [[ " ${missing[*]} " == *" prometheus "* ]]; then
      echo "  prometheus is wanted for its promtool only: so that the install starts no Prometheus server (port 9090)," >&2
      echo "  run it after (when you have no /usr/sbin/policy-rc.d of your own)" >&2
      echo "  printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d" >&2
      echo "  and after it: rm /usr/sbin/policy-rc.d; systemctl disable prometheus || update-rc.d prometheus disable" >&2
    fi
    echo "  and run this script again (or see docs/operating.md, \"Local services\")." >&2
    exit 1
  fi
  echo "services: installing ${missing[*]}"
  own_policy=""
  if [[ " ${missing[*]} " == *" prometheus "* && ! -e /usr/sbin/policy-rc.d ]]; then
    # For this install only (a policy-rc.d already there decides by itself):
    # invoke-rc.d and deb-systemd-invoke ask it before starting a service;
    # 101 refuses Prometheus, 0 lets any other start as usual.
    own_policy=/usr/sbin/policy-rc.d
    trap 'rm -f "$own_policy"' EXIT
    printf '%s\n' '#!/bin/sh' '# scripts/services.sh, during its apt-get install: no Prometheus server.' \
      'case " $* " in *" prometheus "*|*" prometheus.service "*) exit 101 ;; esac' 'exit 0' \
      > "$own_policy"
    chmod 755 "$own_policy"
  fi
  bash -c "$install"
  if [[ -n $own_policy ]]; then
    rm -f "$own_policy"
    trap - EXIT
  fi
  if [[ " ${missing[*]} " == *" prometheus "* ]]; then
    # Nor one at boot.
    systemctl disable --quiet prometheus 2>/dev/null || update-rc.d prometheus disable 2>/dev/null || true
  fi
  if [[ " ${missing[*]} " == *" postgresql "* ]]; then
    # A cluster we just created: trust local TCP connections, as the tests
    # and the demo connect as postgres@127.0.0.1 without a password.
    for hba in /etc/postgresql/*/main/pg_hba.conf; do
      printf 'host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' | cat - "$hba" > "$hba.new"
      mv "$hba.new" "$hba"
    done
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main reload 2>/dev/null || true
  fi
fi

if ! pg_isready -h 127.0.0.1 -q; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  wait_for PostgreSQL 60 pg_isready -h 127.0.0.1 -q
fi

if ! redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis 30 redis-cli -h 127.0.0.1 ping
fi

if ! rabbitmqctl -q status >/dev/null 2>&1; then
  echo "services: starting RabbitMQ"
  rabbitmq-server -detached || true
  wait_for RabbitMQ 120 rabbitmqctl -q status
fi
# The AMQP listener can lag behind the node being up.
wait_for "RabbitMQ AMQP port" 60 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672'
echo "services: PostgreSQL, Redis and RabbitMQ are up; Chromium $(chromium --version 2>/dev/null | awk '{print $2}') for the console's tests"
