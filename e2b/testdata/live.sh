#!/usr/bin/env bash
# live.sh CMD [ARG...] runs CMD against a live bothyd, as the E2B SDK flows beside it need
# (js/run.sh, python/run.sh): builds bothyd and bothyd-runtime from this checkout, starts
# bothyd as root on a free loopback port with a temporary state root and token, points
# E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL at it, and runs CMD in the current directory.
# BOTHY_RESTART names a script the flow runs to kill bothyd (SIGKILL) and start it again
# on the same state. CMD's exit status is live.sh's; bothyd is stopped after it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ $# -gt 0 ] || { echo "usage: live.sh CMD [ARG...]" >&2; exit 2; }

if [ "$(id -u)" -ne 0 ]; then
	echo "e2b live.sh: sandboxes need root; run as root. Skipping." >&2
	exit 0
fi
tmp=$(mktemp -d)
cleanup() {
	status=$?
	pid=$(cat "$tmp/bothyd.pid" 2>/dev/null || true)
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	if [ "$status" -ne 0 ] && [ -f "$tmp/bothyd.log" ]; then
		echo "e2b live.sh: the last lines of bothyd's log:" >&2
		tail -n 40 "$tmp/bothyd.log" >&2
	fi
	rm -rf --one-file-system "$tmp"
	exit "$status"
}
trap cleanup EXIT

(cd "$repo" && go build -o "$tmp/bin/bothyd" ./cmd/bothyd && go build -o "$tmp/bin/bothyd-runtime" ./cmd/bothyd-runtime)
port=$(node -e 'const s = require("node:net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });')
url="http://127.0.0.1:$port"
token=$(node -e 'console.log(require("node:crypto").randomBytes(24).toString("hex"))')
(umask 077 && printf '%s\n' "$token" >"$tmp/token")

# bothyd.sh starts bothyd on the port and state root, or with "restart" kills the running
# one with SIGKILL first, as a crash would, and starts it again on the same state: the flow
# runs it to show that E2B's processes outlive bothyd. It returns once /healthz answers.
cat >"$tmp/bothyd.sh" <<SCRIPT
#!/usr/bin/env bash
set -euo pipefail
if [ "\${1:-}" = restart ]; then
	old=\$(cat "$tmp/bothyd.pid")
	kill -KILL "\$old"
	while kill -0 "\$old" 2>/dev/null; do sleep 0.05; done
fi
setsid "$tmp/bin/bothyd" --listen "127.0.0.1:$port" --root "$tmp/root" --token-file "$tmp/token" \\
	--log-format json --log-level info >>"$tmp/bothyd.log" 2>&1 </dev/null &
new=\$!
echo "\$new" >"$tmp/bothyd.pid"
for _ in \$(seq 1 300); do
	kill -0 "\$new" 2>/dev/null || { echo "e2b live.sh: bothyd exited before it served /healthz" >&2; exit 1; }
	node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$url/healthz" && exit 0
	sleep 0.1
done
echo "e2b live.sh: bothyd did not serve /healthz" >&2
exit 1
SCRIPT
bash "$tmp/bothyd.sh"
unset E2B_DEBUG E2B_DOMAIN
BOTHY_RESTART="$tmp/bothyd.sh" E2B_API_KEY="e2b_$token" E2B_API_URL=$url E2B_SANDBOX_URL=$url E2B_VOLUME_API_URL=$url "$@"
