#!/usr/bin/env bash
# Runs flow.test.mjs, the unmodified E2B JS SDK (pinned in package-lock.json), against a live
# sandboxd: builds sandboxd and sandboxd-runtime from this checkout, starts sandboxd as root on
# a free loopback port with a temporary state root and token, points E2B_API_KEY, E2B_API_URL
# and E2B_SANDBOX_URL at it, and runs the test with node --test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)

if [ "$(id -u)" -ne 0 ]; then
	echo "e2b run.sh: sandboxes need root; run as root. Skipping." >&2
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
	if [ "$status" -ne 0 ] && [ -f "$tmp/sandboxd.log" ]; then
		echo "e2b run.sh: the last lines of sandboxd's log:" >&2
		tail -n 40 "$tmp/sandboxd.log" >&2
	fi
	rm -rf --one-file-system "$tmp"
	exit "$status"
}
trap cleanup EXIT

cd "$here"
[ -d node_modules ] || npm ci --no-audit --no-fund --ignore-scripts
(cd "$repo" && go build -o "$tmp/bin/sandboxd" ./cmd/sandboxd && go build -o "$tmp/bin/sandboxd-runtime" ./cmd/sandboxd-runtime)
port=$(node -e 'const s = require("node:net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });')
url="http://127.0.0.1:$port"
token=$(node -e 'console.log(require("node:crypto").randomBytes(24).toString("hex"))')
(umask 077 && printf '%s\n' "$token" >"$tmp/token")
"$tmp/bin/sandboxd" --listen "127.0.0.1:$port" --root "$tmp/root" --token-file "$tmp/token" \
	--log-format json --log-level info >"$tmp/sandboxd.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
	kill -0 "$pid" 2>/dev/null || { echo "e2b run.sh: sandboxd exited before it served /healthz" >&2; exit 1; }
	node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$url/healthz" && break
	sleep 0.1
done
unset E2B_DEBUG E2B_DOMAIN
E2B_API_KEY="e2b_$token" E2B_API_URL=$url E2B_SANDBOX_URL=$url node --test --test-concurrency=1 "$@" flow.test.mjs
