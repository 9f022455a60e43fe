#!/usr/bin/env bash
# Redrive's main job on this machine's local services: builds the binaries and
# runs the demo (topology, a real incident made by RabbitMQ, capture, precheck,
# plan, canary, main wave, audit report, self-checks). Exits non-zero when a
# check fails. Arguments go to redrive-demo (--kill-executor, --small, --console, --help).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  case "$arg" in
  -h | --help)
    # Printed here, before anything is built (a test keeps it in step with
    # redrive-demo's own --help).
    cat <<'USAGE'
Usage: scripts/demo.sh [--small] [--kill-executor] [--console]

Starts the local services (scripts/services.sh), builds the binaries, and
runs Redrive's main job with TLS and authentication on: a real RabbitMQ
incident is captured, prechecked, planned, approved, replayed canary first by
executor processes, and audited; the demo checks the result and exits non-zero
when a check fails.

Options:
      --small          The end-to-end test's smaller incident (345 dead letters) instead of the full one (2,050)
      --kill-executor  SIGKILL one executor a third into the main wave and start another (the audit then marks what it held `uncertain`)
      --console        After the run, keep the planner up and print the operator console's address and two sign-in tokens (an operator, an approver); Ctrl-C stops
  -h, --help           Print help
USAGE
    exit 0
    ;;
  esac
done
bash scripts/services.sh
cargo build --bins
exec "${CARGO_TARGET_DIR:-target}/debug/redrive-demo" "$@"
