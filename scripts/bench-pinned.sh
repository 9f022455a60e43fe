#!/usr/bin/env bash
# Runs a benchmark with the broker on a core of its own (issue "Scale").
#
#   scripts/bench-pinned.sh [BENCH] [ARGS...]
#
# BENCH is a benchmark of the redrive-tests package (default: throughput);
# ARGS go to it. The environment passes through (REDRIVE_BENCH_MESSAGES, ...).
#
# In production RabbitMQ has hosts of its own. On a 2-core machine this
# imitates that: every RabbitMQ process (beam.smp, epmd, erl_child_setup) is
# pinned to CPU 0 and PostgreSQL, Redis, the benchmark (which runs the
# planner in-process and the raw reference client) and the executors it
# starts to CPU 1, with `taskset -a` (every thread). The raw reference and
# Redrive then get the same single core for everything that is not the
# broker, and their ratio is what Redrive costs.
#
# The benchmark is built first, unpinned. Every affinity found is recorded
# and put back when the script ends, also when the benchmark fails or the
# script is interrupted (INT, TERM); PostgreSQL backends started while
# pinned inherit the pin and get the machine's full CPU set back. A
# `kill -9` of this script cannot restore: run it again with `--restore`
# (which puts every process of those services on every online CPU).
#
# REDRIVE_PIN_BROKER_CPU and REDRIVE_PIN_STACK_CPU choose other CPUs.
# This reconfigures the shared local services for the benchmark's length:
# never run it beside the test suite or another benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

broker_cpu=${REDRIVE_PIN_BROKER_CPU:-0}
stack_cpu=${REDRIVE_PIN_STACK_CPU:-1}
all_cpus=$(cat /sys/devices/system/cpu/online)

broker_names=(beam.smp epmd erl_child_setup inet_gethost)
stack_names=(postgres redis-server)

pids_of() {
    local name
    for name in "$@"; do
        pgrep -x "$name" || true
    done
}

restore_all() {
    local pid
    for pid in $(pids_of "${broker_names[@]}" "${stack_names[@]}"); do
        taskset -a -cp "$all_cpus" "$pid" >/dev/null 2>&1 || true
    done
}

if [[ ${1:-} == --restore ]]; then
    restore_all
    echo "every RabbitMQ, PostgreSQL and Redis process is on CPUs $all_cpus again"
    exit 0
fi
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi

bench=${1:-throughput}
shift || true

if [[ $(nproc --all) -lt 2 ]]; then
    echo "bench-pinned: this needs at least 2 CPUs (found $(nproc --all))" >&2
    exit 2
fi
for cpu in "$broker_cpu" "$stack_cpu"; do
    if ! taskset -c "$cpu" true 2>/dev/null; then
        echo "bench-pinned: CPU $cpu is not online here (online: $all_cpus)" >&2
        exit 2
    fi
done
if [[ -z $(pids_of beam.smp) ]]; then
    echo "bench-pinned: no RabbitMQ (beam.smp) process is running" >&2
    exit 2
fi

cargo bench -p redrive-tests --bench "$bench" --no-run

declare -A saved=()
restore() {
    local pid
    for pid in $(pids_of "${broker_names[@]}" "${stack_names[@]}"); do
        taskset -a -cp "${saved[$pid]:-$all_cpus}" "$pid" >/dev/null 2>&1 || true
    done
    echo "bench-pinned: CPU affinities restored" >&2
}
for pid in $(pids_of "${broker_names[@]}" "${stack_names[@]}"); do
    saved[$pid]=$(taskset -cp "$pid" | sed 's/.*: //')
done
trap restore EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for pid in $(pids_of "${broker_names[@]}"); do
    taskset -a -cp "$broker_cpu" "$pid" >/dev/null
done
for pid in $(pids_of "${stack_names[@]}"); do
    taskset -a -cp "$stack_cpu" "$pid" >/dev/null
done
echo "bench-pinned: RabbitMQ on CPU $broker_cpu; PostgreSQL, Redis, the benchmark and its executors on CPU $stack_cpu" >&2

REDRIVE_BENCH_PINNED="broker=$broker_cpu,stack=$stack_cpu" \
    taskset -c "$stack_cpu" cargo bench -p redrive-tests --bench "$bench" -- "$@"
