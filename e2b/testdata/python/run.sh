#!/usr/bin/env bash
# Runs flow.py, the unmodified E2B Python SDK, against a live bothyd that ../live.sh builds
# and starts. The SDK must be importable by python3 (PYTHON names another interpreter): it
# comes from PyPI, which this project's machines and CI do not reach, so without it this
# says so and exits 0 (see README.md). Arguments go to unittest (e.g. SyncFlow).
set -euo pipefail
cd "$(dirname "$0")"
py=${PYTHON:-python3}
if ! "$py" -c 'import e2b' 2>/dev/null; then
	echo "e2b python/run.sh: $py cannot import the e2b SDK (PyPI's e2b; see README.md). Skipping." >&2
	exit 0
fi
exec bash ../live.sh "$py" flow.py "$@"
