package control

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// dialHandler is a fakeHandler that also dials: to its listener's port, and refuses others.
type dialHandler struct {
	*fakeHandler
	ln     net.Listener
	dialed chan struct{}
}

func (d *dialHandler) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port != d.ln.Addr().(*net.TCPAddr).Port {
		return nil, &RemoteError{Code: CodePortRefused, Message: "Nothing listens there."}
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", d.ln.Addr().String())
	if err == nil && d.dialed != nil {
		d.dialed <- struct{}{}
	}
	return c, err
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// TestDialPortCarriesBytesBothWays: a dial reaches the service, bytes flow both ways, the
// service's close reads as EOF at the client, and the client's close ends the service's
// connection.
func TestDialPortCarriesBytesBothWays(t *testing.T) {
	t.Parallel()
	ln := listenLoopback(t)
	c, _ := dial(t, &dialHandler{fakeHandler: newFake(), ln: ln})
	if !slices.Contains(c.Features(), FeatureDial) {
		t.Fatalf("features %v lack %s", c.Features(), FeatureDial)
	}
	served := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer s.Close()
		// Echo upper-cased until the client is done, then say bye and end.
		buf := make([]byte, 5)
		if _, err := io.ReadFull(s, buf); err != nil {
			served <- err
			return
		}
		_, err = s.Write(bytes.ToUpper(buf))
		served <- err
	}()
	conn, err := c.DialPort(context.Background(), ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn) // the service's close ends the read
	if err != nil || string(got) != "HELLO" {
		t.Fatalf("read %q, %v; want HELLO and EOF", got, err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// TestDialPortClientCloseEndsServiceConn: closing the client's connection closes the agent's
// connection to the service, which then reads EOF.
func TestDialPortClientCloseEndsServiceConn(t *testing.T) {
	t.Parallel()
	ln := listenLoopback(t)
	c, _ := dial(t, &dialHandler{fakeHandler: newFake(), ln: ln})
	conn, err := c.DialPort(context.Background(), ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn.Close()
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := s.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the service read %d, %v after the client closed; want EOF", n, err)
	}
	// A closed connection's reads return at once.
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("a read on a closed connection succeeded")
	}
}

// TestDialPortRefused: nothing listening is port-unreachable, and the session goes on.
func TestDialPortRefused(t *testing.T) {
	t.Parallel()
	ln := listenLoopback(t)
	c, _ := dial(t, &dialHandler{fakeHandler: newFake(), ln: ln})
	_, err := c.DialPort(context.Background(), 1)
	if !errors.Is(err, errcode.PortUnreachable) {
		t.Fatalf("dial to a closed port: %v, want port-unreachable", err)
	}
	if _, err := c.DialPort(context.Background(), 0); !errors.Is(err, errcode.InvalidRequest) {
		t.Fatalf("port 0: %v, want invalid-request", err)
	}
	if _, err := c.Stats(context.Background()); err != nil {
		t.Fatalf("the session ended after a refused dial: %v", err)
	}
}

// TestDialPortWithoutFeature: an agent whose handler does not dial does not announce the
// feature, and the client refuses to ask it.
func TestDialPortWithoutFeature(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, newFake())
	if slices.Contains(c.Features(), FeatureDial) {
		t.Fatalf("a handler without DialPort announced %s", FeatureDial)
	}
	if _, err := c.DialPort(context.Background(), 80); err == nil {
		t.Fatal("DialPort to an agent without the feature succeeded")
	}
}

// TestDialPortConcurrentWithExec: a dial's connection and an exec run on the same session
// side by side.
func TestDialPortConcurrentWithExec(t *testing.T) {
	t.Parallel()
	ln := listenLoopback(t)
	c, _ := dial(t, &dialHandler{fakeHandler: newFake(), ln: ln})
	conn, err := c.DialPort(context.Background(), ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"echo"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin, "in")
	p.Stdin.Close()
	go io.Copy(io.Discard, p.Stderr)
	out, _ := io.ReadAll(p.Stdout)
	if st, err := p.Wait(); err != nil || st.ExitCode != 5 || string(out) != "in" {
		t.Fatalf("exec beside a port connection: %+v %v %q", st, err, out)
	}
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(conn, b); err != nil || b[0] != 'x' {
		t.Fatalf("the port connection after the exec: %q %v", b, err)
	}
}
