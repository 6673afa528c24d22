package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pipeHandler is the fake agent with FeatureStdoutPipe: its "print N" writes N bytes of a
// pattern to the passed pipe and "err" to stderr; "linger" leaves a copy of the pipe open and
// silent after the exit, as a background process that inherited it would.
type pipeHandler struct {
	*fakeHandler
	mu      sync.Mutex
	holders []*os.File
}

func (h *pipeHandler) UsesStdoutPipes() {}

func (h *pipeHandler) Exec(ctx context.Context, req *ExecRequest, s *ExecStream) (ExitStatus, error) {
	out := s.StdoutPipe()
	if out == nil {
		return h.fakeHandler.Exec(ctx, req, s)
	}
	s.Started(7)
	switch req.Argv[0] {
	case "print":
		var n int
		fmt.Sscan(req.Argv[1], &n)
		if _, err := out.Write(seeded(req.Argv[2], n)); err != nil {
			return ExitStatus{}, err
		}
		io.WriteString(s.Stderr(), "err")
		return ExitStatus{ExitCode: 3}, nil
	case "linger":
		fd, err := unix.Dup(int(out.Fd()))
		if err != nil {
			return ExitStatus{}, err
		}
		h.mu.Lock()
		h.holders = append(h.holders, os.NewFile(uintptr(fd), "holder"))
		h.mu.Unlock()
		io.WriteString(out, "before exit")
		return ExitStatus{}, nil
	}
	return ExitStatus{}, errors.New("unexpected")
}

func seeded(seed string, n int) []byte {
	return bytes.Repeat([]byte(seed), n/len(seed)+1)[:n]
}

// unixPair returns a connected pair of unix stream sockets, as the namespace runtime's.
func unixPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socket")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return conns[0], conns[1]
}

// dialUnix runs Serve over a connected pair of unix sockets, as the namespace runtime does.
func dialUnix(t *testing.T, h Handler) *Client {
	t.Helper()
	a, b := unixPair(t)
	conn, done := serveOn(t, a, b, h)
	c, _ := dialOn(t, conn, done)
	return c
}

// readAll reads an exec's output with ReadOutput and returns stdout and stderr.
func readAll(p *Process) (stdout, stderr []byte, err error) {
	b := make([]byte, 64<<10)
	for {
		t, n, err := p.ReadOutput(b)
		if t == FrameStderr {
			stderr = append(stderr, b[:n]...)
		} else {
			stdout = append(stdout, b[:n]...)
		}
		if err == io.EOF {
			return stdout, stderr, nil
		}
		if err != nil {
			return stdout, stderr, err
		}
	}
}

func TestStdoutPipe(t *testing.T) {
	t.Parallel()
	h := &pipeHandler{fakeHandler: newFake()}
	c := dialUnix(t, h)
	if !slices.Contains(c.Features(), FeatureStdoutPipe) {
		t.Fatalf("an agent over a unix socket did not announce %s: %v", FeatureStdoutPipe, c.Features())
	}
	ctx := context.Background()

	t.Run("read output", func(t *testing.T) {
		p, err := c.ExecPiped(ctx, ExecRequest{Argv: []string{"print", "9000000", "abc"}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if p.pipe == nil {
			t.Fatal("the exec's stdout came in frames, not through a pipe")
		}
		stdout, stderr, err := readAll(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(stdout, seeded("abc", 9000000)) || string(stderr) != "err" {
			t.Fatalf("got %d bytes of stdout (want 9000000 of the pattern) and stderr %q", len(stdout), stderr)
		}
		st, err := p.Wait()
		if err != nil || st.ExitCode != 3 {
			t.Fatalf("exit %+v, %v; want code 3", st, err)
		}
	})

	t.Run("stdout and stderr readers", func(t *testing.T) {
		p, err := c.ExecPiped(ctx, ExecRequest{Argv: []string{"print", "100000", "xy"}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var stderr []byte
		done := make(chan struct{})
		go func() {
			defer close(done)
			stderr, _ = io.ReadAll(p.Stderr)
		}()
		stdout, err := io.ReadAll(p.Stdout)
		<-done
		if err != nil || !bytes.Equal(stdout, seeded("xy", 100000)) || string(stderr) != "err" {
			t.Fatalf("stdout %d bytes (%v), stderr %q", len(stdout), err, stderr)
		}
		if st, err := p.Wait(); err != nil || st.ExitCode != 3 {
			t.Fatalf("exit %+v, %v", st, err)
		}
	})

	t.Run("a silent holder does not keep the exec open", func(t *testing.T) {
		defer func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			for _, f := range h.holders {
				f.Close()
			}
		}()
		p, err := c.ExecPiped(ctx, ExecRequest{Argv: []string{"linger"}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		stdout, _, err := readAll(p)
		if err != nil || string(stdout) != "before exit" {
			t.Fatalf("stdout %q, %v", stdout, err)
		}
		// ReadOutput returned: the drain ended although a writer still holds the pipe.
		h.mu.Lock()
		held := len(h.holders)
		h.mu.Unlock()
		if held != 1 {
			t.Fatalf("%d holders; the test's premise is one", held)
		}
	})

	t.Run("concurrent execs each read their own pipe", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				seed := fmt.Sprintf("<%d>", i)
				p, err := c.ExecPiped(ctx, ExecRequest{Argv: []string{"print", "300000", seed}})
				if err != nil {
					errs <- err
					return
				}
				defer p.Close()
				stdout, _, err := readAll(p)
				if err == nil && !bytes.Equal(stdout, seeded(seed, 300000)) {
					err = fmt.Errorf("exec %d read %d bytes that are not its own", i, len(stdout))
				}
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("a terminal still comes in frames", func(t *testing.T) {
		echoInFrames(t, c.ExecPiped, ExecRequest{Argv: []string{"echo"}, TTY: true, Stdin: true})
	})

	t.Run("Exec, not ExecPiped, comes in frames", func(t *testing.T) {
		echoInFrames(t, c.Exec, ExecRequest{Argv: []string{"echo"}, Stdin: true})
	})
}

func TestStdoutPipeNotOverOtherConnections(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, &pipeHandler{fakeHandler: newFake()})
	if slices.Contains(c.Features(), FeatureStdoutPipe) {
		t.Fatalf("an agent over a connection that is not a unix socket announced %s", FeatureStdoutPipe)
	}
	c2 := dialUnix(t, newFake())
	if slices.Contains(c2.Features(), FeatureStdoutPipe) {
		t.Fatalf("a handler that does not use stdout pipes announced %s", FeatureStdoutPipe)
	}
	echoInFrames(t, c2.ExecPiped, ExecRequest{Argv: []string{"echo"}, Stdin: true})
}

// echoInFrames runs the fake's echo with exec and req, which must not be given a stdout pipe, and
// expects its stdin back in frames.
func echoInFrames(t *testing.T, exec func(context.Context, ExecRequest) (*Process, error), req ExecRequest) {
	t.Helper()
	p, err := exec(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.pipe != nil {
		t.Fatalf("exec %+v was given a stdout pipe", req)
	}
	io.WriteString(p.Stdin, "hi")
	p.Stdin.Close()
	stdout, stderr, err := readAll(p)
	if err != nil || string(stdout) != "hi" || string(stderr) != "done" {
		t.Fatalf("echo: stdout %q, stderr %q, %v", stdout, stderr, err)
	}
}

// A request that names a descriptor the connection never carried, or one claimed already, is
// refused rather than waited for.
func TestClaimOfAnUnknownDescriptor(t *testing.T) {
	t.Parallel()
	r := newFDReceiver(nil)
	r.received = 2
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	r.unclaimed[2] = f
	if got, err := r.claim(2); err != nil || got != f {
		t.Fatalf("claim of an arrived descriptor: %v, %v", got, err)
	}
	f.Close()
	for _, n := range []uint64{0, 1, 2} {
		if _, err := r.claim(n); err == nil {
			t.Errorf("claim of descriptor %d succeeded; it never came or was claimed", n)
		}
	}
	r.fail(errors.New("connection gone"))
	if _, err := r.claim(3); err == nil {
		t.Error("claim of a descriptor on a failed connection succeeded")
	}
}

// Descriptors that no request claims (their streams failed after they left) are closed, the
// oldest first, once more than maxUnclaimedFDs are held; the newest can still be claimed.
func TestUnclaimedDescriptorsAreBounded(t *testing.T) {
	t.Parallel()
	r := newFDReceiver(nil)
	total := maxUnclaimedFDs + 10
	for sent := 0; sent < total; {
		var fds []int
		for range min(maxRightsPerWrite, total-sent) {
			fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			fds = append(fds, fd)
		}
		sent += len(fds)
		if err := r.collect(unix.UnixRights(fds...), 0); err != nil {
			t.Fatal(err)
		}
	}
	if len(r.unclaimed) != maxUnclaimedFDs {
		t.Fatalf("%d unclaimed descriptors held, want the bound %d", len(r.unclaimed), maxUnclaimedFDs)
	}
	if _, err := r.claim(1); err == nil {
		t.Error("the oldest descriptor could still be claimed after the bound closed it")
	}
	f, err := r.claim(uint64(total))
	if err != nil {
		t.Fatalf("the newest descriptor: %v", err)
	}
	f.Close()
	r.fail(ErrClosed)
}

// A descriptor is queued at once even while a write waits for a peer that does not read: an
// exec on a stalled connection fails by its own deadline, not behind the send loop.
func TestSendDoesNotWaitForAWrite(t *testing.T) {
	t.Parallel()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := os.NewFile(uintptr(fds[1]), "peer")
	defer peer.Close()
	f := os.NewFile(uintptr(fds[0]), "socket")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := &fdSender{UnixConn: conn.(*net.UnixConn)}
	defer s.Close()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		s.Write(make([]byte, 64<<20)) // more than the socket holds: it waits for the peer
	}()
	// Bytes at the peer: the write is under way, and it cannot have finished.
	pfd := []unix.PollFd{{Fd: int32(peer.Fd()), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 10000); n != 1 || err != nil {
		t.Fatalf("no bytes reached the peer: %d, %v", n, err)
	}
	queued := make(chan error, 1)
	go func() {
		r, w, err := os.Pipe()
		if err == nil {
			r.Close()
			_, err = s.send(w)
		}
		queued <- err
	}()
	select {
	case err := <-queued:
		if err != nil {
			t.Fatal(err)
		}
	case <-wrote:
		t.Fatal("the write ended before the test's end")
	case <-time.After(10 * time.Second):
		t.Fatal("send waited behind a write the peer does not read")
	}
}
