# A small service for the port tests, run inside a sandbox with python3 from the host's /usr.
# Port 8000: HTTP; GET and POST answer JSON naming the path, the headers and the body's size,
# and /ws is a websocket that answers each message with "echo:" and the message. Port 9000:
# TCP echo. Only the standard library: the sandbox has no network to install anything.
import base64, hashlib, json, socket, socketserver, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class HTTP(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's algorithm and the
        # client's delayed ACK add 40 ms to every answer, which the figures would measure.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def answer(self, size):
        body = json.dumps({"path": self.path, "method": self.command, "size": size,
                           "headers": dict(self.headers.items())}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/ws"):
            return self.websocket()
        self.answer(0)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        left = n
        while left > 0:
            left -= len(self.rfile.read(min(left, 65536)))
        self.answer(n)

    def websocket(self):
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        r = self.rfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = int.from_bytes(r.read(2), "big")
            elif n == 127:
                n = int.from_bytes(r.read(8), "big")
            mask = r.read(4) if h[1] & 128 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            if op == 9:
                self.wfile.write(bytes([0x8A, len(data)]) + data)
                self.wfile.flush()
                continue
            out = b"echo:" + data
            hdr = bytes([0x80 | op]) + (bytes([len(out)]) if len(out) < 126 else bytes([126]) + len(out).to_bytes(2, "big"))
            self.wfile.write(hdr + out)
            self.wfile.flush()


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            b = self.request.recv(65536)
            if not b:
                return
            self.request.sendall(b)


socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
echo = socketserver.ThreadingTCPServer(("127.0.0.1", 9000), Echo)
threading.Thread(target=echo.serve_forever, daemon=True).start()
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", 8000), HTTP).serve_forever()
