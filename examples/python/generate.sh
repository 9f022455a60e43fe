#!/usr/bin/env bash
# Generates Python stubs for redrive.v1 from the repository's .proto files into
# ./gen (gitignored), with the protoc bundled in grpcio-tools (no system protoc).
# Run it again whenever proto/redrive/v1/*.proto changes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$here/../../proto"
python="${PYTHON:-python3}"
rm -rf "$here/gen"
mkdir -p "$here/gen"
"$python" -m grpc_tools.protoc \
  --proto_path="$proto" \
  --python_out="$here/gen" \
  --pyi_out="$here/gen" \
  --grpc_python_out="$here/gen" \
  "$proto"/redrive/v1/*.proto
echo "stubs in $here/gen/redrive/v1"
