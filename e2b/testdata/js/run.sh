#!/usr/bin/env bash
# Runs flow.test.mjs, the unmodified E2B JS SDK (pinned in package-lock.json), against a live
# bothyd that ../live.sh builds and starts; arguments go to node --test.
# BOTHY_CLUSTER=1 runs the flow's sandbox tests against a cluster's router instead: a real
# API server, two node bothyds and a router, which tests/cluster_e2b_test.go starts.
set -euo pipefail
cd "$(dirname "$0")"
[ -d node_modules ] || npm ci --no-audit --no-fund --ignore-scripts
if [ "${BOTHY_CLUSTER:-}" = 1 ]; then
	cd ../../.. && exec go test -count=1 -v -run 'TestClusterE2BFlow$' ./tests
fi
exec bash ../live.sh node --test --test-concurrency=1 "$@" flow.test.mjs
