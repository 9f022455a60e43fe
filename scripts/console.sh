#!/usr/bin/env bash
# Builds the operator console's page (console/dist/, which the planner compiles
# in): npm ci (pinned by console/package-lock.json), the API's code generation
# from proto/, and the esbuild bundle. With --check (CI), builds into a
# scratch copy, type-checks it and runs its unit tests, and fails when the
# result differs from the committed console/dist/ or console/src/gen/
# (docs/console.md).
set -euo pipefail
cd "$(dirname "$0")/.."
check=false
case "${1:-}" in
--check) check=true ;;
"") ;;
-h | --help)
  echo "Usage: scripts/console.sh [--check]"
  echo "Builds console/dist/ (npm ci, npm run gen, npm run build); --check fails when it differs from what is committed."
  exit 0
  ;;
*)
  echo "scripts/console.sh: unknown argument $1 (try --help)" >&2
  exit 2
  ;;
esac
command -v npm >/dev/null 2>&1 || {
  echo "scripts/console.sh: npm not found: install Node.js 20 or newer" >&2
  exit 1
}
if $check; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  mkdir -p "$scratch/repo"
  cp -a proto "$scratch/repo/proto"
  rsync -a --exclude node_modules console/ "$scratch/repo/console/" 2>/dev/null ||
    (mkdir -p "$scratch/repo/console" && tar -C console --exclude node_modules -cf - . | tar -C "$scratch/repo/console" -xf -)
  (cd "$scratch/repo/console" && npm ci --no-audit --no-fund --loglevel=error && npm run --silent gen &&
    npm run --silent build && npm run --silent check && npm test --silent >/dev/null)
  if ! diff -r console/dist "$scratch/repo/console/dist" >/dev/null ||
    ! diff -r console/src/gen "$scratch/repo/console/src/gen" >/dev/null; then
    diff -r console/dist "$scratch/repo/console/dist" | head -20 >&2 || true
    diff -r console/src/gen "$scratch/repo/console/src/gen" | head -20 >&2 || true
    echo "scripts/console.sh: console/dist or console/src/gen differ from a rebuild: run scripts/console.sh and commit" >&2
    exit 1
  fi
  echo "console: the committed build matches a rebuild"
else
  (cd console && npm ci --no-audit --no-fund --loglevel=error && npm run --silent gen && npm run --silent build)
  echo "console: built console/dist/ ($(gzip -9 -c console/dist/app.js | wc -c) bytes of JavaScript gzipped)"
fi
