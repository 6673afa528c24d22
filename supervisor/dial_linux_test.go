//go:build linux

package supervisor

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDialSendsNoCapabilityToAStranger: a control socket whose listener is not the sandbox's
// runtime process (a relay, or a socket something else put in its place) is refused before a
// byte of the hello, which carries the capability, is written; the runtime process's own
// socket gets the hello. Without the peer check, the stranger read the capability.
func TestDialSendsNoCapabilityToAStranger(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "control.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	capability := []byte("a-capability-no-stranger-may-read")
	s := &Supervisor{}

	for _, tc := range []struct {
		name     string
		shimPid  int
		wantSent bool
	}{
		{"listener is another process", os.Getpid() + 1, false},
		{"listener is the runtime process", os.Getpid(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan []byte, 1)
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					got <- nil
					return
				}
				defer conn.Close()
				// Read what the dialler sends until it closes or goes quiet.
				_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				b, _ := io.ReadAll(conn)
				got <- b
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			client, err := s.dialAgent(ctx, path, capability, tc.shimPid)
			if err == nil {
				client.Close()
				t.Fatal("dialAgent succeeded against a listener that is no agent")
			}
			// The hello is JSON, where the capability travels in base64.
			sent := bytes.Contains(<-got, []byte(base64.StdEncoding.EncodeToString(capability)))
			if sent != tc.wantSent {
				t.Fatalf("capability sent = %v, want %v (dial error: %v)", sent, tc.wantSent, err)
			}
		})
	}
}
