//go:build linux

package platform

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestDialUnixLongPath(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "control.sock")
	if len(path) <= maxSunPath {
		t.Fatalf("test path %d bytes is not long enough", len(path))
	}
	// Listen through the same /proc/self/fd trick, as a plain bind would fail.
	dirFD, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer dirFD.Close()
	ln, err := net.Listen("unix", "/proc/self/fd/"+strconv.Itoa(int(dirFD.Fd()))+"/control.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	conn, err := DialUnix(context.Background(), path)
	if err != nil {
		t.Fatalf("DialUnix(%d-byte path): %v", len(path), err)
	}
	defer conn.Close()
	buf := make([]byte, 2)
	if _, err := conn.Read(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q, %v", buf, err)
	}
}
