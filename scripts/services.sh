#!/usr/bin/env bash
# Makes sure the local PostgreSQL 15, Redis 7 and RabbitMQ that Redrive's tests,
# benchmarks and demo use are up on their standard ports, starting any that is
# down with the commands of this machine kind (see README, "Local services").
# Never stops or reconfigures a running server.
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
echo "services: PostgreSQL, Redis and RabbitMQ are up"
