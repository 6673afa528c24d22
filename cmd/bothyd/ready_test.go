package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestNotifyReadyWaitsForHealthz: bothyd tells systemd READY=1 only once its /healthz
// answers 200, not when its socket is bound: while /healthz fails, no notification arrives.
func TestNotifyReadyWaitsForHealthz(t *testing.T) {
	var healthy atomic.Bool
	asked := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		select {
		case asked <- struct{}{}:
		default:
		}
		if !healthy.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)

	done := make(chan struct{})
	go func() { notifyReady(t.Context(), srv.Listener.Addr(), discard); close(done) }()
	// Two answers of 503 seen, and still nothing told.
	for range 2 {
		select {
		case <-asked:
		case <-time.After(5 * time.Second):
			t.Fatal("notifyReady does not ask /healthz")
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := conn.Read(make([]byte, 64)); err == nil {
		t.Fatalf("notified (%d bytes) while /healthz fails", n)
	}
	healthy.Store(true)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 4096)
	n, err := conn.Read(b)
	if err != nil {
		t.Fatalf("no READY=1 once /healthz answers: %v", err)
	}
	if got, want := string(b[:n]), "READY=1\nSTATUS=serving on "+srv.Listener.Addr().String(); got != want {
		t.Fatalf("notification %q, want %q", got, want)
	}
	<-done
}

func TestDialable(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"0.0.0.0:7780", "127.0.0.1:7780"},
		{"[::]:7780", "[::1]:7780"},
		{"192.0.2.1:80", "192.0.2.1:80"},
	} {
		a, err := net.ResolveTCPAddr("tcp", c.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := dialable(a); got != c.want {
			t.Errorf("dialable(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}
