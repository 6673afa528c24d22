package control

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// outputHandler is the fake agent for the output tests: "mixed" writes outputPieces, then
// exits 3; "broken" writes a little and then fails; the rest is fakeHandler's.
type outputHandler struct{ *fakeHandler }

type outputPiece struct {
	stderr bool
	data   []byte
}

// outputPieces alternate between the streams, in pieces that are smaller and larger than a
// frame, written both with Write and through ReadFrom (a reader without WriteTo), which moves
// from small to large frames as its reads fill.
var outputPieces = []outputPiece{
	{false, []byte("a")},
	{true, pattern(100_000, 1)},
	{false, pattern(outputChunkSize*4+17, 2)},
	{true, []byte("z")},
	{false, pattern(outputChunkSize+chunkSize+3, 3)},
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func (h outputHandler) Exec(ctx context.Context, req *ExecRequest, s *ExecStream) (ExitStatus, error) {
	switch req.Argv[0] {
	case "mixed":
		s.Started(7)
		for i, p := range outputPieces {
			w := s.Stdout()
			if p.stderr {
				w = s.Stderr()
			}
			var err error
			if i%2 == 0 {
				_, err = io.Copy(w, struct{ io.Reader }{bytes.NewReader(p.data)})
			} else {
				_, err = w.Write(p.data)
			}
			if err != nil {
				return ExitStatus{}, err
			}
		}
		return ExitStatus{ExitCode: 3}, nil
	case "broken":
		s.Started(8)
		io.WriteString(s.Stdout(), "partial")
		return ExitStatus{}, &RemoteError{Code: CodePermissionDenied, Message: "No."}
	}
	return h.fakeHandler.Exec(ctx, req, s)
}

// TestReadOutput: ReadOutput yields both streams' output whole and in the order the agent
// sent it, in pieces no larger than the caller's buffer, then io.EOF with the status in Wait.
func TestReadOutput(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, outputHandler{newFake()})
	p, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"mixed"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []outputPiece
	buf := make([]byte, 100_003)
	for {
		typ, n, err := p.ReadOutput(buf)
		if n > len(buf) || (n == 0 && err == nil) {
			t.Fatalf("ReadOutput read %d bytes into %d, err %v", n, len(buf), err)
		}
		if n > 0 {
			if typ != FrameStdout && typ != FrameStderr {
				t.Fatalf("output of type %s", typ)
			}
			stderr := typ == FrameStderr
			if len(got) == 0 || got[len(got)-1].stderr != stderr {
				got = append(got, outputPiece{stderr: stderr})
			}
			last := &got[len(got)-1]
			last.data = append(last.data, buf[:n]...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != len(outputPieces) {
		t.Fatalf("%d runs of output, want %d", len(got), len(outputPieces))
	}
	for i, want := range outputPieces {
		if got[i].stderr != want.stderr || !bytes.Equal(got[i].data, want.data) {
			t.Fatalf("run %d: stderr %v, %d bytes; want stderr %v, %d bytes", i, got[i].stderr, len(got[i].data), want.stderr, len(want.data))
		}
	}
	if _, _, err := p.ReadOutput(buf); err != io.EOF {
		t.Fatalf("ReadOutput after the end: %v", err)
	}
	if st, err := p.Wait(); err != nil || st.ExitCode != 3 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if _, err := p.Stdout.Read(buf); !errors.Is(err, errOutputMode) {
		t.Fatalf("reading Stdout after ReadOutput: %v", err)
	}
}

// TestReadOutputEnds covers the other ends of ReadOutput: the agent's error, a Close before
// the exit, and output already read through the pipes.
func TestReadOutputEnds(t *testing.T) {
	t.Parallel()
	f := newFake()
	c, _ := dial(t, outputHandler{f})
	ctx := context.Background()
	buf := make([]byte, 1024)
	drain := func(p *Process) (string, error) {
		var out []byte
		for {
			_, n, err := p.ReadOutput(buf)
			out = append(out, buf[:n]...)
			if err != nil {
				return string(out), err
			}
		}
	}

	t.Run("agent error", func(t *testing.T) {
		p, err := c.Exec(ctx, ExecRequest{Argv: []string{"broken"}})
		if err != nil {
			t.Fatal(err)
		}
		out, err := drain(p)
		var re *RemoteError
		if out != "partial" || !errors.As(err, &re) || re.Code != CodePermissionDenied {
			t.Fatalf("output %q, err %v", out, err)
		}
		if _, werr := p.Wait(); werr != err {
			t.Fatalf("wait: %v, ReadOutput: %v", werr, err)
		}
	})

	t.Run("closed", func(t *testing.T) {
		p, err := c.Exec(ctx, ExecRequest{Argv: []string{"hang"}})
		if err != nil {
			t.Fatal(err)
		}
		res := make(chan error, 1)
		go func() { _, err := drain(p); res <- err }()
		p.Close()
		select {
		case <-f.execCancelled:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not cancel the exec")
		}
		select {
		case err := <-res:
			if !errors.Is(err, ErrNoExit) {
				t.Fatalf("ReadOutput after Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("ReadOutput did not return after Close")
		}
		if _, err := p.Wait(); !errors.Is(err, ErrNoExit) {
			t.Fatalf("wait after Close: %v", err)
		}
	})

	t.Run("pipes first", func(t *testing.T) {
		p, err := c.Exec(ctx, ExecRequest{Argv: []string{"mixed"}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, err := p.Stdout.Read(buf); err != nil {
			t.Fatal(err)
		}
		if _, _, err := p.ReadOutput(buf); !errors.Is(err, errOutputMode) {
			t.Fatalf("ReadOutput after Stdout: %v", err)
		}
	})
}
