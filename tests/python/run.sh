#!/usr/bin/env bash
# Generates a Python client from openapi/openapi.yaml with openapi-python-client (the version
# pinned below, its default options) and runs test_flows.py with it against a live bothyd:
# builds bothyd and bothyd-runtime from this checkout, starts bothyd as root on a free
# loopback port with a temporary state root and token, waits for /healthz, runs the flows,
# and stops the server. The generator and the client's runtime dependencies (httpx, attrs,
# python-dateutil) are pip-installed into a temporary venv; where PyPI cannot be reached the
# script says so and skips, as it does without root. OPENAPI_PYTHON_CLIENT and PYTHON name a
# generator command and an interpreter that has those dependencies instead of the venv's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
generator_version=0.29.0

if [ "$(id -u)" -ne 0 ]; then
	echo "tests/python: sandboxes need root; run as root. Skipping the generated Python client's flows." >&2
	exit 0
fi

tmp=$(mktemp -d)
pid=""
cleanup() {
	status=$?
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	if [ "$status" -ne 0 ] && [ -f "$tmp/bothyd.log" ]; then
		echo "tests/python: the last lines of bothyd's log:" >&2
		tail -n 40 "$tmp/bothyd.log" >&2
	fi
	rm -rf --one-file-system "$tmp"
	exit "$status"
}
trap cleanup EXIT

generator=${OPENAPI_PYTHON_CLIENT:-}
python=${PYTHON:-}
if [ -z "$generator" ]; then
	python3 -m venv "$tmp/venv"
	if ! "$tmp/venv/bin/pip" install --quiet --disable-pip-version-check --retries 1 --timeout 20 \
		"openapi-python-client==$generator_version" "python-dateutil==2.9.0.post0" >"$tmp/pip.log" 2>&1; then
		echo "tests/python: pip cannot install openapi-python-client==$generator_version here (no PyPI?); skipping the generated Python client's flows:" >&2
		tail -n 3 "$tmp/pip.log" >&2
		exit 0
	fi
	generator="$tmp/venv/bin/openapi-python-client"
	python=${python:-$tmp/venv/bin/python}
fi
python=${python:-python3}

echo "tests/python: generating the client" >&2
(cd "$tmp" && $generator generate --path "$repo/openapi/openapi.yaml" --output-path "$tmp/client")
[ -d "$tmp/client/bothy_client" ] || { echo "tests/python: the generator wrote no bothy_client package" >&2; exit 1; }

echo "tests/python: building bothyd and bothyd-runtime" >&2
(cd "$repo" && go build -o "$tmp/bin/bothyd" ./cmd/bothyd && go build -o "$tmp/bin/bothyd-runtime" ./cmd/bothyd-runtime)

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
url="http://127.0.0.1:$port"
token=$("$python" -c 'import secrets; print(secrets.token_hex(24))')
(umask 077 && printf '%s\n' "$token" >"$tmp/token")
"$tmp/bin/bothyd" --listen "127.0.0.1:$port" --root "$tmp/root" --token-file "$tmp/token" \
	--log-format json --log-level info >"$tmp/bothyd.log" 2>&1 &
pid=$!

healthy() { "$python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$url/healthz" 2>/dev/null; }
for _ in $(seq 1 300); do
	kill -0 "$pid" 2>/dev/null || { echo "tests/python: bothyd exited before it served /healthz" >&2; exit 1; }
	healthy && break
	sleep 0.1
done
healthy || { echo "tests/python: bothyd did not serve /healthz within 30 s" >&2; exit 1; }

echo "tests/python: bothyd at $url" >&2
BOTHY_URL=$url BOTHY_TOKEN=$token PYTHONPATH="$tmp/client" "$python" "$here/test_flows.py"
