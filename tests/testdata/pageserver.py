# A service for the port page test (issue 37), run in a sandbox with python3 from the host's
# /usr, on port 8001. It logs every request it gets (request line and headers) and serves:
# /      a page whose script reports what the page can see of itself (its URL, cookies,
#        referrer, storage) by loading report?d=<base64 JSON>, and links to /next;
# /log   the requests logged so far, as JSON lines.
import json, socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = b"""<!doctype html><html><head><title>page</title></head><body>
<a id="next" href="next?from=page">next</a>
<script>
// A sandboxed page (an opaque origin) may not read its cookies or storage: each read that
// throws reports "denied".
const read = (f) => { try { return String(f()); } catch (e) { return "denied"; } };
const seen = {url: read(() => document.URL), cookie: read(() => document.cookie),
  referrer: read(() => document.referrer), href: read(() => location.href),
  storage: read(() => JSON.stringify(Object.assign({}, localStorage))),
  session: read(() => JSON.stringify(Object.assign({}, sessionStorage)))};
const img = new Image();
img.onload = img.onerror = () => { document.title = "reported"; };
img.src = "report?d=" + encodeURIComponent(btoa(JSON.stringify(seen)));
</script></body></html>"""

LOG = []


class HTTP(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, ctype, body):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/log":
            return self.reply("application/x-ndjson", "".join(json.dumps(e) + "\n" for e in LOG).encode())
        LOG.append({"line": self.requestline, "headers": self.headers.as_string()})
        if self.path.startswith("/report"):
            return self.reply("image/gif", b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")
        self.reply("text/html", PAGE)


if __name__ == "__main__":
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer(("127.0.0.1", 8001), HTTP).serve_forever()
