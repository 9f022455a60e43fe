#!/usr/bin/env bash
# Redrive's main job on this machine's local services: builds the binaries and
# runs the demo (topology, a real incident made by RabbitMQ, capture, summary,
# precheck, self-checks). Exits non-zero when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
cargo build --bins
exec "${CARGO_TARGET_DIR:-target}/debug/redrive-demo"
