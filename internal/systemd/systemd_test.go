package systemd

import (
	"bytes"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestJournalHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(NewJournalHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	log.Debug("d", "k", 1)
	log.Info("i")
	log.Log(t.Context(), slog.LevelInfo+2, "i2")
	log.Warn("w", "err", "x\ny")
	log.Error("e")
	log.With("sandbox", "abc").WithGroup("g").Info("grouped", "k", "v")
	want := []string{
		`<7>level=DEBUG msg=d k=1`,
		`<6>level=INFO msg=i`,
		`<6>level=INFO+2 msg=i2`,
		`<4>level=WARN msg=w err="x\ny"`,
		`<3>level=ERROR msg=e`,
		`<6>level=INFO msg=grouped sandbox=abc g.k=v`,
	}
	got := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("journal lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestJournalHandlerLevel(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(NewJournalHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	log.Info("dropped")
	log.Warn("kept")
	if got := buf.String(); got != "<4>level=WARN msg=kept\n" {
		t.Fatalf("got %q", got)
	}
}

func TestJournalOffJournal(t *testing.T) {
	// A variable naming another stream, as a child whose stderr was redirected inherits it.
	t.Setenv("JOURNAL_STREAM", "1:1")
	if StderrIsJournal() {
		t.Fatal("stderr taken for the journal's stream though JOURNAL_STREAM names another file")
	}
	var buf bytes.Buffer
	if Journal(&buf) {
		t.Fatal("a buffer taken for the journal")
	}
}

// listenNotify is a notification socket as systemd makes one, named by NOTIFY_SOCKET.
func listenNotify(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

func receive(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4096)
	n, err := conn.Read(b)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	return string(b[:n])
}

func TestNotify(t *testing.T) {
	conn := listenNotify(t)
	if sent, err := Ready("serving"); !sent || err != nil {
		t.Fatalf("Ready: sent %v, %v", sent, err)
	}
	if got := receive(t, conn); got != "READY=1\nSTATUS=serving" {
		t.Fatalf("got %q", got)
	}
	if sent, err := Stopping(); !sent || err != nil {
		t.Fatalf("Stopping: sent %v, %v", sent, err)
	}
	if got := receive(t, conn); got != "STOPPING=1\nSTATUS=shutting down" {
		t.Fatalf("got %q", got)
	}
}

func TestNotifyWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Ready("x"); sent || err != nil {
		t.Fatalf("without NOTIFY_SOCKET: sent %v, %v; want nothing sent and no error", sent, err)
	}
}
