package tests

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSystemdNotify runs bothyd as a Type=notify unit would, with NOTIFY_SOCKET naming a
// datagram socket the test listens on: READY=1 arrives, and when it does /healthz answers;
// SIGTERM brings STOPPING=1 before bothyd exits.
func TestSystemdNotify(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock) // bothyd inherits the test's environment

	d := startDaemon(t, withToken("notify-token-0123456789abcdef"))
	msg := receiveNotify(t, conn)
	if !strings.HasPrefix(msg, "READY=1\n") {
		t.Fatalf("first notification %q, want READY=1", msg)
	}
	resp, err := http.Get(d.URL + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz after READY=1: %v %v", resp, err)
	}
	resp.Body.Close()
	if want := "STATUS=serving on " + strings.TrimPrefix(d.URL, "http://"); !strings.Contains(msg, want) {
		t.Fatalf("READY=1 notification %q lacks %q", msg, want)
	}

	d.Stop()
	if msg := receiveNotify(t, conn); !strings.HasPrefix(msg, "STOPPING=1") {
		t.Fatalf("notification at SIGTERM %q, want STOPPING=1", msg)
	}
}

func receiveNotify(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4096)
	n, err := conn.Read(b)
	if err != nil {
		t.Fatalf("no notification from bothyd: %v", err)
	}
	return string(b[:n])
}
