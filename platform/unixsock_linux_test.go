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

// TestListenDialNoFollow: a socket made by ListenUnix takes a connection from
// DialUnixNoFollow, whose peer credentials are this process's (the one that listened), even
// when another descriptor of the socket accepts.
func TestListenDialNoFollow(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), strings.Repeat("l", 100))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "control.sock")
	lf, err := ListenUnix(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v, want a 0600 socket", fi, err)
	}
	ln, err := net.FileListener(lf)
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
	conn, err := DialUnixNoFollow(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pid, uid, _, err := PeerCred(conn)
	if err != nil || pid != os.Getpid() || uid != os.Geteuid() {
		t.Fatalf("PeerCred = pid %d uid %d (%v), want %d %d", pid, uid, err, os.Getpid(), os.Geteuid())
	}
	buf := make([]byte, 2)
	if _, err := conn.Read(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q, %v", buf, err)
	}
	// A second listen replaces the socket left behind.
	lf2, err := ListenUnix(path, 0o600)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	lf2.Close()
}

// TestDialUnixNoFollowRefuses: a link in the socket's place, even to a live socket, and a
// socket in a directory that others may write are refused; a plain DialUnix would follow.
func TestDialUnixNoFollowRefuses(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	realDir := filepath.Join(base, "realDir")
	if err := os.Mkdir(realDir, 0o700); err != nil {
		t.Fatal(err)
	}
	lf, err := ListenUnix(filepath.Join(realDir, "s.sock"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	planted := filepath.Join(base, "planted")
	if err := os.Mkdir(planted, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(planted, "control.sock")
	if err := os.Symlink(filepath.Join(realDir, "s.sock"), link); err != nil {
		t.Fatal(err)
	}
	if c, err := DialUnix(context.Background(), link); err != nil {
		t.Fatalf("the plain dial does not follow the link, so this test proves nothing: %v", err)
	} else {
		c.Close()
	}
	if c, err := DialUnixNoFollow(context.Background(), link); err == nil {
		c.Close()
		t.Fatal("DialUnixNoFollow followed a link to a socket")
	}
	// A directory link in place of the socket's directory.
	dirLink := filepath.Join(base, "dirlink")
	if err := os.Symlink(realDir, dirLink); err != nil {
		t.Fatal(err)
	}
	if c, err := DialUnixNoFollow(context.Background(), filepath.Join(dirLink, "s.sock")); err == nil {
		c.Close()
		t.Fatal("DialUnixNoFollow followed a link in place of the directory")
	}
	if err := os.Chmod(realDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if c, err := DialUnixNoFollow(context.Background(), filepath.Join(realDir, "s.sock")); err == nil {
		c.Close()
		t.Fatal("DialUnixNoFollow accepted a socket in a directory anyone may write")
	}
}
