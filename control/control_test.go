package control

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/bothy/bothy/errcode"
)

var capability = []byte("the-capability-of-this-launch")

// fakeHandler records what the protocol layer hands it; the agent's tests exercise the real
// operations.
type fakeHandler struct {
	execCancelled chan struct{}
	statCancelled chan struct{}
	// statHung hears of a Stat of /hang once it waits.
	statHung chan struct{}
}

func newFake() *fakeHandler {
	return &fakeHandler{execCancelled: make(chan struct{}, 1), statCancelled: make(chan struct{}, 1), statHung: make(chan struct{}, 1)}
}

func (f *fakeHandler) Version() string { return "fake/1" }

func (f *fakeHandler) Exec(ctx context.Context, req *ExecRequest, s *ExecStream) (ExitStatus, error) {
	switch req.Argv[0] {
	case "fail":
		return ExitStatus{}, &RemoteError{Code: CodeCommandNotFound, Message: "No such command."}
	case "echo":
		s.Started(42)
		io.Copy(s.Stdout(), s.Stdin())
		io.WriteString(s.Stderr(), "done")
		return ExitStatus{ExitCode: 5}, nil
	case "control":
		// Reports the resize and signal it receives on stdout, then exits.
		s.Started(43)
		ws := <-s.Resizes()
		sig := <-s.Signals()
		io.WriteString(s.Stdout(), sig)
		return ExitStatus{ExitCode: int(ws.Rows)}, nil
	case "order":
		// Writes what it reads of stdin, and each resize as "[rows]", in the order it sees
		// them.
		s.Started(45)
		s.OnResize(func(ws WindowSize) { fmt.Fprintf(s.Stdout(), "[%d]", ws.Rows) })
		io.Copy(s.Stdout(), s.Stdin())
		return ExitStatus{}, nil
	case "hang":
		s.Started(44)
		<-ctx.Done()
		f.execCancelled <- struct{}{}
		return ExitStatus{Signal: "KILL", ExitCode: 137}, nil
	}
	return ExitStatus{}, errors.New("unexpected")
}

func (f *fakeHandler) ReadFile(ctx context.Context, req *FileRequest) (io.ReadCloser, int64, error) {
	content := io.NopCloser(bytes.NewReader(bytes.Repeat([]byte("x"), 100_000)))
	switch req.Path {
	case "/missing":
		return nil, 0, &RemoteError{Code: CodeFileNotFound, Message: "No such file."}
	case "/grew": // it had 1000 bytes when it was opened
		return content, 1000, nil
	case "/shrank": // it had 200 000 bytes when it was opened
		return content, 200_000, nil
	case "/proc":
		return content, UnknownSize, nil
	}
	return content, 100_000, nil
}

func (f *fakeHandler) WriteFile(ctx context.Context, req *FileRequest, r io.Reader) (int64, error) {
	if req.Path == "/refuse" {
		return 0, &RemoteError{Code: CodePermissionDenied, Message: "No."}
	}
	return io.Copy(io.Discard, r)
}

func (f *fakeHandler) List(ctx context.Context, req *FileRequest, emit func([]FileInfo) error) error {
	for i := range 3 {
		if err := emit([]FileInfo{{Name: string(rune('a' + i)), Type: TypeFile}}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeHandler) Stat(ctx context.Context, req *FileRequest) (FileInfo, error) {
	if req.Path == "/hang" {
		f.statHung <- struct{}{}
		<-ctx.Done()
		f.statCancelled <- struct{}{}
		return FileInfo{}, ctx.Err()
	}
	if req.Path == "/internal" {
		return FileInfo{}, errors.New("secret host detail /var/lib/x")
	}
	return FileInfo{Name: "f", Type: TypeFile, Size: 3}, nil
}

func (f *fakeHandler) Mkdir(ctx context.Context, req *FileRequest) error  { return nil }
func (f *fakeHandler) Remove(ctx context.Context, req *FileRequest) error { return nil }
func (f *fakeHandler) Shutdown(ctx context.Context, grace time.Duration) error {
	return nil
}
func (f *fakeHandler) Stats(ctx context.Context) (Stats, error) { return Stats{Pids: 7}, nil }

// serve runs Serve over net.Pipe and returns the client end and Serve's result (the channel
// yields it once; the cleanup checks Serve returned through a second channel).
func serve(t *testing.T, h Handler) (net.Conn, <-chan error) {
	t.Helper()
	a, b := net.Pipe()
	return serveOn(t, a, b, h)
}

// serveOn is serve over the connected pair a (the client's end) and b.
func serveOn(t *testing.T, a, b net.Conn, h Handler) (net.Conn, <-chan error) {
	t.Helper()
	done := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		done <- Serve(b, capability, h)
		close(returned)
	}()
	t.Cleanup(func() {
		a.Close()
		select {
		case <-returned:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return a, done
}

func dial(t *testing.T, h Handler) (*Client, <-chan error) {
	t.Helper()
	conn, done := serve(t, h)
	return dialOn(t, conn, done)
}

// dialOn is dial over conn, whose Serve reports on done.
func dialOn(t *testing.T, conn net.Conn, done <-chan error) (*Client, <-chan error) {
	t.Helper()
	c, err := Dial(conn, capability, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, done
}

func TestHello(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, newFake())
	if got := c.Features(); len(got) != 5 || c.AgentVersion() != "fake/1" {
		t.Fatalf("features %v version %q", got, c.AgentVersion())
	}
}

func TestHelloWrongCapability(t *testing.T) {
	t.Parallel()
	for _, cap := range [][]byte{nil, []byte("wrong"), append([]byte(nil), capability[:len(capability)-1]...)} {
		conn, done := serve(t, newFake())
		if _, err := Dial(conn, cap, 5*time.Second); err == nil {
			t.Fatalf("capability %q accepted", cap)
		}
		if err := <-done; !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("Serve: %v, want ErrUnauthorized", err)
		}
	}
}

// rawSession opens a yamux session by hand, to speak the protocol wrongly.
func rawSession(t *testing.T) (*yamux.Session, <-chan error) {
	conn, done := serve(t, newFake())
	sess, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	return sess, done
}

func TestOperationBeforeHelloClosesSession(t *testing.T) {
	t.Parallel()
	sess, done := rawSession(t)
	st, err := sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	writeJSON(&frameWriter{w: st}, FrameHeader, Header{Op: OpStats})
	if err := <-done; !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("Serve: %v, want ErrUnauthorized", err)
	}
	select {
	case <-sess.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("session not closed")
	}
}

func TestHelloProtocolMismatch(t *testing.T) {
	t.Parallel()
	sess, done := rawSession(t)
	st, _ := sess.OpenStream()
	writeJSON(&frameWriter{w: st}, FrameHeader, Header{Op: OpHello, Hello: &HelloRequest{Protocol: ProtocolVersion + 1, Capability: capability}})
	typ, p, err := ReadFrame(st, nil)
	if err != nil || typ != FrameError {
		t.Fatalf("answer %s %v", typ, err)
	}
	var re *RemoteError
	if decodeErr := decodeRemoteError(p); !errors.As(decodeErr, &re) || re.Code != CodeProtocolMismatch {
		t.Fatalf("answer: %v", decodeErr)
	}
	st.Close()
	if err := <-done; err == nil {
		t.Fatal("Serve accepted another protocol")
	}
}

func TestOversizedFrameDropsStream(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, newFake())
	st, err := c.sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	var hdr [frameHeaderSize]byte
	hdr[0] = byte(FrameHeader)
	binary.BigEndian.PutUint32(hdr[1:], MaxFramePayload+1)
	st.Write(hdr[:])
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := ReadFrame(st, nil); err != io.EOF {
		t.Fatalf("agent answered an oversized frame: %v", err)
	}
	// The connection still works.
	if s, err := c.Stats(context.Background()); err != nil || s.Pids != 7 {
		t.Fatalf("stats after: %+v %v", s, err)
	}
}

func TestExecProtocol(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, newFake())
	ctx := context.Background()

	p, err := c.Exec(ctx, ExecRequest{Argv: []string{"echo"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		p.Stdin.Write(bytes.Repeat([]byte("y"), 200_000))
		p.Stdin.Close()
	}()
	errc := make(chan []byte)
	go func() { b, _ := io.ReadAll(p.Stderr); errc <- b }()
	out, _ := io.ReadAll(p.Stdout)
	st, err := p.Wait()
	if err != nil || st.ExitCode != 5 || len(out) != 200_000 || string(<-errc) != "done" || p.PID != 42 {
		t.Fatalf("status %+v err %v out %d", st, err, len(out))
	}

	p, err = c.Exec(ctx, ExecRequest{Argv: []string{"control"}, TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Resize(50, 132)
	p.Signal("int")
	go io.Copy(io.Discard, p.Stderr)
	out, _ = io.ReadAll(p.Stdout)
	if st, err := p.Wait(); err != nil || st.ExitCode != 50 || string(out) != "INT" {
		t.Fatalf("control: %+v %v %q", st, err, out)
	}

	// Resizes sent between stdin writes reach the handler in their place among them.
	p, err = c.Exec(ctx, ExecRequest{Argv: []string{"order"}, TTY: true, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := range 20 {
			io.WriteString(p.Stdin, "ab")
			p.Resize(uint16(i+1), 80)
		}
		io.WriteString(p.Stdin, "end")
		p.Stdin.Close()
	}()
	go io.Copy(io.Discard, p.Stderr)
	out, _ = io.ReadAll(p.Stdout)
	var want strings.Builder
	for i := range 20 {
		fmt.Fprintf(&want, "ab[%d]", i+1)
	}
	want.WriteString("end")
	if st, err := p.Wait(); err != nil || string(out) != want.String() {
		t.Fatalf("order: %+v %v\n got %q\nwant %q", st, err, out, want.String())
	}

	_, err = c.Exec(ctx, ExecRequest{Argv: []string{"fail"}})
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeCommandNotFound || errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("failed start: %v", err)
	}
}

// TestClientGoneCancels checks the protocol's rule at its source: the handler's context ends
// when the client closes the stream or the connection before the exit.
func TestClientGoneCancels(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"process", "client"} {
		f := newFake()
		c, _ := dial(t, f)
		p, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"hang"}})
		if err != nil {
			t.Fatal(err)
		}
		if how == "process" {
			p.Close()
		} else {
			c.Close()
		}
		select {
		case <-f.execCancelled:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s close did not cancel the exec", how)
		}
		if _, err := p.Wait(); !errors.Is(err, ErrNoExit) {
			t.Fatalf("wait after close: %v", err)
		}
	}
}

func TestContextCancelsOperation(t *testing.T) {
	t.Parallel()
	f := newFake()
	c, _ := dial(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := c.Stat(ctx, "/hang", ""); errc <- err }()
	// Cancel only once the operation reached the handler... which we cannot see from here;
	// cancelling at any point must end both sides.
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("stat: %v", err)
	}
}

func TestSimpleOperations(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, newFake())
	ctx := context.Background()
	if fi, err := c.Stat(ctx, "/f", ""); err != nil || fi.Size != 3 {
		t.Fatalf("stat %+v %v", fi, err)
	}
	if _, err := c.Stat(ctx, "/internal", ""); errcode.Of(err) != errcode.Internal || bytes.Contains([]byte(err.Error()), []byte("/var/lib")) {
		t.Fatalf("internal error leaked or mis-coded: %v", err)
	}
	if list, err := c.List(ctx, "/", ""); err != nil || len(list) != 3 {
		t.Fatalf("list %+v %v", list, err)
	}
	if err := c.Mkdir(ctx, "/d", "", 0o755, true); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, "/d", "root", true); err != nil {
		t.Fatal(err)
	}
	// A read yields exactly the size the file had when it was opened, or fails; a file of
	// unknown size is read to its end.
	for _, tc := range []struct {
		path  string
		size  int64
		read  int
		fails bool
	}{
		{"/f", 100_000, 100_000, false},
		{"/grew", 1000, 1000, false},
		{"/shrank", 200_000, 100_000, true},
		{"/proc", UnknownSize, 100_000, false},
	} {
		rc, size, err := c.ReadFile(ctx, tc.path, "")
		if err != nil || size != tc.size {
			t.Fatalf("read %s: size %d %v, want %d", tc.path, size, err, tc.size)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if len(b) != tc.read || (err != nil) != tc.fails {
			t.Fatalf("read %s: %d bytes, %v; want %d bytes, failing %v", tc.path, len(b), err, tc.read, tc.fails)
		}
		var re *RemoteError
		if tc.fails && (!errors.As(err, &re) || re.Code != CodeFileChanged) {
			t.Fatalf("read %s: %v, want %s", tc.path, err, CodeFileChanged)
		}
	}
	if _, _, err := c.ReadFile(ctx, "/missing", ""); !errors.Is(err, errcode.FileNotFound) {
		t.Fatalf("read missing: %v", err)
	}
	if n, err := c.WriteFile(ctx, WriteRequest{Path: "/w"}, bytes.NewReader(make([]byte, 3<<20))); err != nil || n != 3<<20 {
		t.Fatalf("write %d %v", n, err)
	}
	// A refusal while the client still sends must not leave the client blocked on window.
	if _, err := c.WriteFile(ctx, WriteRequest{Path: "/refuse"}, io.LimitReader(zeros{}, 64<<20)); errcode.Of(err) != errcode.PermissionDenied {
		t.Fatalf("refused write: %v", err)
	}
	if _, err := c.Stat(ctx, "relative", ""); errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("relative: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestShutdownEndsServe(t *testing.T) {
	t.Parallel()
	c, done := dial(t, newFake())
	if err := c.Shutdown(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrShutdown) {
			t.Fatalf("Serve: %v, want ErrShutdown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after shutdown")
	}
}

// TestOperationAfterShutdownIsNotRunning: an operation opened after the agent answered a
// shutdown, while the session lingers for an operation from before it, is refused as the
// sandbox not running (the API's 409), not as a failure of the transport (500).
func TestOperationAfterShutdownIsNotRunning(t *testing.T) {
	t.Parallel()
	f := newFake()
	c, done := dial(t, f)
	hang, cancel := context.WithCancel(context.Background())
	defer cancel()
	hung := make(chan error, 1)
	go func() { _, err := c.Stat(hang, "/hang", ""); hung <- err }()
	<-f.statHung
	if err := c.Shutdown(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := c.Stat(context.Background(), "/f", "")
	if errcode.Of(err) != errcode.NotRunning {
		t.Fatalf("a stat after the shutdown: %v, want %s", err, errcode.NotRunning)
	}
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeShuttingDown {
		t.Fatalf("a stat after the shutdown: %v, want the agent's %s", err, CodeShuttingDown)
	}
	cancel()
	<-hung
	if err := <-done; !errors.Is(err, ErrShutdown) {
		t.Fatalf("Serve: %v, want ErrShutdown", err)
	}
}

// TestOperationAfterTheConnectionEndedIsNotRunning: once the agent's connection is gone (its
// sandbox stopped), an operation fails with ErrClosed, which the API answers not-running.
func TestOperationAfterTheConnectionEndedIsNotRunning(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, newFake())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	_, err := c.Stat(context.Background(), "/f", "")
	if !errors.Is(err, ErrClosed) || errcode.Of(err) != errcode.NotRunning {
		t.Fatalf("a stat after the connection ended: %v, want ErrClosed as %s", err, errcode.NotRunning)
	}
}

// TestRemoteErrorCodes: the refusals a sandbox's files make keep codes of their own through
// the control client (not invalid-request, which the server answers 400 and the contract
// keeps for requests it marks invalid); errors.As still reaches the agent's code.
func TestRemoteErrorCodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		agent string
		want  errcode.Code
	}{
		{CodeFileNotFound, errcode.FileNotFound},
		{CodePermissionDenied, errcode.PermissionDenied},
		{CodeNotADirectory, errcode.NotADirectory},
		{CodeIsADirectory, errcode.IsADirectory},
		{CodeNotRegular, errcode.NotARegularFile},
		{CodeDirectoryNotEmpty, errcode.DirectoryNotEmpty},
		{CodeFileExists, errcode.FileExists},
		{CodeSymlinkLoop, errcode.SymlinkLoop},
		{CodeNameTooLong, errcode.NameTooLong},
		{CodeMountInside, errcode.MountInside},
		{CodeFileChanged, errcode.FileChanged},
		{CodeNoSpace, errcode.StorageFull},
		{CodePidsLimit, errcode.PidsLimit},
		{CodeLimitReached, errcode.LimitReached},
		{CodeInvalidRequest, errcode.InvalidRequest},
		{CodeCommandNotFound, errcode.InvalidRequest},
		{CodeNotExecutable, errcode.InvalidRequest},
		{"made-up", errcode.Internal},
	}
	for _, tc := range cases {
		t.Run(tc.agent, func(t *testing.T) {
			t.Parallel()
			err := fmt.Errorf("read: %w", (&RemoteError{Code: tc.agent, Message: "Why."}).Err())
			if got := errcode.Of(err); got != tc.want {
				t.Fatalf("code %q: errcode %q, want %q", tc.agent, got, tc.want)
			}
			var re *RemoteError
			if !errors.As(err, &re) || re.Code != tc.agent {
				t.Fatalf("code %q: the agent's code is lost: %v", tc.agent, err)
			}
		})
	}
}
