#!/usr/bin/env bash
# Generates Python stubs for redrive.v1 from the repository's .proto files into
# ./gen (gitignored), or into the directory given as the first argument (the
# scripts then find them through REDRIVE_STUBS), with the protoc bundled in
# grpcio-tools (no system protoc); PYTHON names the interpreter (python3).
# Run it again whenever proto/redrive/v1/*.proto changes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$here/../../proto"
python="${PYTHON:-python3}"
out="${1:-$here/gen}"
rm -rf "$out"
mkdir -p "$out"
"$python" -m grpc_tools.protoc \
  --proto_path="$proto" \
  --python_out="$out" \
  --pyi_out="$out" \
  --grpc_python_out="$out" \
  "$proto"/redrive/v1/*.proto
echo "stubs in $out/redrive/v1"
