#!/usr/bin/env bash
# Redrive's main job on this machine's local services: builds the binaries and
# runs the demo (topology, a real incident made by RabbitMQ, capture, precheck,
# plan, canary, main wave, audit report, self-checks). Exits non-zero when a
# check fails. Arguments go to redrive-demo (--kill-executor, --small, --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
cargo build --bins
exec "${CARGO_TARGET_DIR:-target}/debug/redrive-demo" "$@"
