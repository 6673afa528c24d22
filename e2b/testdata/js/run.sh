#!/usr/bin/env bash
# Runs flow.test.mjs, the unmodified E2B JS SDK (pinned in package-lock.json), against a live
# bothyd that ../live.sh builds and starts; arguments go to node --test.
set -euo pipefail
cd "$(dirname "$0")"
[ -d node_modules ] || npm ci --no-audit --no-fund --ignore-scripts
exec bash ../live.sh node --test --test-concurrency=1 "$@" flow.test.mjs
