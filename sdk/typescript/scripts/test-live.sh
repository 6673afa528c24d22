#!/usr/bin/env bash
# Runs the SDK's tests against a live bothyd: builds bothyd and bothyd-runtime from this
# checkout into a temporary directory, starts bothyd as root on a free loopback port with a
# temporary state root and a token file that this script writes (so the tests do not depend on
# the server's default token), waits for /healthz, runs `npm test`, and stops the server.
# SDK_TEST_TOKEN=none starts the server without a token instead, to check that the SDK works
# against both. Extra arguments go to node --test (for example --test-name-pattern=exec).
set -euo pipefail
sdk=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$sdk/../.." && pwd)

if [ "$(id -u)" -ne 0 ]; then
	echo "test-live: sandboxes need root (namespaces, overlayfs, cgroups); run as root. Skipping the SDK's live tests." >&2
	exit 0
fi

# BOTHY_CLUSTER=1 runs the tests of sandboxes, exec, files, checkpoints, errors, waiting and
# events against a cluster's router instead: a real API server, two node bothyds and a
# router, which tests/cluster_sdk_test.go starts.
if [ "${BOTHY_CLUSTER:-}" = 1 ]; then
	cd "$sdk"
	[ -d node_modules ] || npm ci --no-audit --no-fund
	npm run --silent build
	cd "$repo" && exec go test -count=1 -v -run 'TestClusterTSSDKLive$' ./tests
fi

tmp=$(mktemp -d)
pid=""
cleanup() {
	status=$?
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		# Remove what the tests left behind (a failed test may not reach its own cleanup), so
		# that no sandbox outlives the server, then stop the server.
		BOTHY_URL=$url BOTHY_TOKEN=$token node "$sdk/scripts/remove-all.mjs" || true
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	if [ "$status" -ne 0 ] && [ -f "$tmp/bothyd.log" ]; then
		echo "test-live: the last lines of bothyd's log:" >&2
		tail -n 40 "$tmp/bothyd.log" >&2
	fi
	rm -rf --one-file-system "$tmp"
	exit "$status"
}
trap cleanup EXIT

cd "$sdk"
[ -d node_modules ] || npm ci --no-audit --no-fund
npm run --silent build

echo "test-live: building bothyd and bothyd-runtime" >&2
(cd "$repo" && go build -o "$tmp/bin/bothyd" ./cmd/bothyd && go build -o "$tmp/bin/bothyd-runtime" ./cmd/bothyd-runtime)

# A free loopback port: the kernel picks one for a listener that is closed at once. Another
# process could take it before bothyd binds it; then bothyd fails to start and so does
# this script, loudly.
port=$(node -e 'const s = require("node:net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });')
url="http://127.0.0.1:$port"
token=""
auth=()
if [ "${SDK_TEST_TOKEN:-file}" != none ]; then
	token=$(node -e 'console.log(require("node:crypto").randomBytes(24).toString("hex"))')
	(umask 077 && printf '%s\n' "$token" >"$tmp/token")
	auth=(--token-file "$tmp/token")
fi

"$tmp/bin/bothyd" --listen "127.0.0.1:$port" --root "$tmp/root" "${auth[@]}" \
	--log-format json --log-level info >"$tmp/bothyd.log" 2>&1 &
pid=$!

# Wait for /healthz, with a deadline; a server that exited is reported at once.
for _ in $(seq 1 300); do
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "test-live: bothyd exited before it served /healthz" >&2
		exit 1
	fi
	if node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$url/healthz"; then
		break
	fi
	sleep 0.1
done
node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$url/healthz" || {
	echo "test-live: bothyd did not serve /healthz within 30 s" >&2
	exit 1
}

# A server started without --token-file may make a token of its own in its state root; then
# the tests use that one.
if [ -z "$token" ] && [ -f "$tmp/root/token" ]; then
	token=$(tr -d '[:space:]' <"$tmp/root/token")
fi
if [ -n "$token" ]; then
	echo "test-live: bothyd at $url, with a token" >&2
else
	echo "test-live: bothyd at $url, without a token" >&2
fi
BOTHY_URL=$url BOTHY_TOKEN=$token node --test --test-concurrency=1 "$@" dist/test/
