package control

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// Handler carries out operations for Serve. The agent implements it; Serve owns the wire.
// Every method may run concurrently with the others and with itself.
type Handler interface {
	// Version is reported in the hello answer.
	Version() string
	// Exec starts the workload, calls s.Started once it runs, streams its output through
	// s.Stdout and s.Stderr, and returns after the workload ended and all of its output was
	// written. When ctx is cancelled (the client closed the stream or the session ended: the
	// client is gone) it must kill the workload and return.
	Exec(ctx context.Context, req *ExecRequest, s *ExecStream) (ExitStatus, error)
	// ReadFile opens a file for a streamed read and returns its size as opened (not by a
	// second lookup of the path, which a rename could point at another file).
	ReadFile(ctx context.Context, req *FileRequest) (io.ReadCloser, int64, error)
	// WriteFile stores everything r yields at req.Path and returns the size. r ends with
	// io.ErrUnexpectedEOF if the client went away before the end; nothing may then be left
	// at the path.
	WriteFile(ctx context.Context, req *FileRequest, r io.Reader) (int64, error)
	// List calls emit with batches of a directory's entries.
	List(ctx context.Context, req *FileRequest, emit func([]FileInfo) error) error
	Stat(ctx context.Context, req *FileRequest) (FileInfo, error)
	Mkdir(ctx context.Context, req *FileRequest) error
	Remove(ctx context.Context, req *FileRequest) error
	// Shutdown ends every process of the sandbox but the agent: TERM, then KILL after grace.
	Shutdown(ctx context.Context, grace time.Duration) error
	Stats(ctx context.Context) (Stats, error)
}

// Serve runs the agent's side of one connection until the connection ends. It requires a
// successful hello carrying capability on the first stream and closes the session otherwise
// (returning ErrUnauthorized). It returns ErrShutdown after it answered a shutdown request:
// the caller must then exit. Serve closes conn, and returns only after every operation of the
// connection finished (cancelled ones included).
func Serve(conn io.ReadWriteCloser, capability []byte, h Handler) error {
	conn, fds := receiverConn(conn)
	sess, err := yamux.Server(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return err
	}
	defer sess.Close()
	if err := serveHello(sess, capability, h, fds); err != nil {
		return err
	}

	// ctx ends every operation of the connection when it ends: a session that died means the
	// client is gone.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-sess.CloseChan()
		cancel()
	}()
	// After a shutdown the accept loop stops, the operations still running (whose workloads
	// the shutdown ended) send their exits, and only then does the session close.
	acceptCtx, stopAccepting := context.WithCancel(ctx)
	defer stopAccepting()
	srv := &server{h: h, sess: sess, fds: fds, stopAccepting: stopAccepting}
	var wg sync.WaitGroup
	for {
		st, err := sess.AcceptStreamWithContext(acceptCtx)
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.serveStream(ctx, st)
		}()
	}
	if srv.shutdown.Load() {
		waitTimeout(&wg, shutdownDrain)
		return ErrShutdown
	}
	cancel()
	wg.Wait()
	return nil
}

// shutdownDrain bounds how long Serve waits, after a shutdown, for the other operations of
// the connection to send their final frames.
const shutdownDrain = 10 * time.Second

func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func serveHello(sess *yamux.Session, capability []byte, h Handler, fds *fdReceiver) error {
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	st, err := sess.AcceptStreamWithContext(ctx)
	if err != nil {
		return fmt.Errorf("control: no hello: %w", err)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(helloTimeout))
	t, p, err := ReadFrame(st, nil)
	if err != nil {
		return fmt.Errorf("control: reading hello: %w", err)
	}
	if t != FrameHeader {
		return ErrUnauthorized
	}
	hdr, err := DecodeHeader(p)
	if err != nil || hdr.Op != OpHello {
		return ErrUnauthorized
	}
	// An empty capability would let anyone in; refuse it as a misconfiguration.
	if len(capability) == 0 || subtle.ConstantTimeCompare(hdr.Hello.Capability, capability) != 1 {
		return ErrUnauthorized
	}
	fw := &frameWriter{w: st}
	if hdr.Hello.Protocol != ProtocolVersion {
		writeError(fw, &RemoteError{Code: CodeProtocolMismatch,
			Message: fmt.Sprintf("The agent speaks control protocol %d, not %d.", ProtocolVersion, hdr.Hello.Protocol)})
		lingerClose(st)
		return fmt.Errorf("control: client speaks protocol %d, want %d", hdr.Hello.Protocol, ProtocolVersion)
	}
	resp := HelloResponse{
		Protocol:     ProtocolVersion,
		Features:     features(h, fds),
		AgentVersion: h.Version(),
	}
	if err := writeJSON(fw, FrameResult, resp); err != nil {
		return err
	}
	lingerClose(st)
	return nil
}

type server struct {
	h    Handler
	sess *yamux.Session
	// fds receives the descriptors bothyd passes; nil unless the connection is a unix
	// socket.
	fds           *fdReceiver
	shutdown      atomic.Bool
	stopAccepting context.CancelFunc
}

func (s *server) serveStream(ctx context.Context, st *yamux.Stream) {
	defer st.Close()
	fw := &frameWriter{w: st}
	st.SetReadDeadline(time.Now().Add(headerTimeout))
	t, p, err := ReadFrame(st, nil)
	if err != nil {
		return
	}
	st.SetReadDeadline(time.Time{})
	if t != FrameHeader {
		writeError(fw, invalidf("A stream must start with a header frame, not %s.", t))
		return
	}
	hdr, err := DecodeHeader(p)
	if err != nil {
		writeError(fw, err)
		return
	}
	switch hdr.Op {
	case OpExec:
		s.serveExec(ctx, st, fw, hdr.Exec)
	case OpWrite:
		s.serveWrite(ctx, st, fw, hdr.File)
	case OpDial:
		s.serveDial(ctx, st, fw, hdr.Dial)
	case OpWatch:
		s.serveWatch(ctx, st, fw, hdr.Watch)
	case OpProcStart, OpProcAttach, OpProcList, OpProcInput:
		s.serveProc(ctx, st, fw, hdr)
	case OpHello:
		writeError(fw, invalidf("Hello was already done on this connection."))
	default:
		s.serveSimple(ctx, st, fw, hdr)
	}
	// The final frame is written; wait a little for the client to read it and close, so the
	// stream ends cleanly on both sides instead of lingering until yamux's close timeout.
	lingerClose(st)
}

// lingerClose closes our side and drains the peer's side until it closes too or a short
// deadline passes.
func lingerClose(st *yamux.Stream) {
	st.Close()
	st.SetReadDeadline(time.Now().Add(closeLinger))
	io.Copy(io.Discard, st)
}

// watchClient cancels an operation whose client goes away. The client sends nothing after
// the header of these operations, so anything it sends, its closing of the stream included,
// ends the operation.
func watchClient(ctx context.Context, st *yamux.Stream) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		var b [1]byte
		_, _ = st.Read(b[:]) // returns at the client's close, a stray frame, or our close deadline
		cancel(errClientGone)
	}()
	return ctx, func() { cancel(nil) }
}

var errClientGone = errors.New("control: the client closed the stream")

func (s *server) serveSimple(ctx context.Context, st *yamux.Stream, fw *frameWriter, hdr *Header) {
	ctx, stop := watchClient(ctx, st)
	defer stop()
	var (
		result any = struct{}{}
		err    error
	)
	switch hdr.Op {
	case OpRead:
		err = s.serveRead(ctx, fw, hdr.File)
		if err == nil {
			return
		}
	case OpList:
		err = s.serveList(ctx, fw, hdr.File)
		if err == nil {
			return
		}
	case OpStat:
		result, err = s.h.Stat(ctx, hdr.File)
	case OpMkdir:
		err = s.h.Mkdir(ctx, hdr.File)
	case OpRemove:
		err = s.h.Remove(ctx, hdr.File)
	case OpStats:
		result, err = s.h.Stats(ctx)
	case OpNetwork:
		err = s.serveNetwork(ctx, hdr.Network)
	case OpShutdown:
		err = s.h.Shutdown(ctx, time.Duration(hdr.Shutdown.GraceMS)*time.Millisecond)
		if err == nil {
			s.shutdown.Store(true)
			// No new operation: the client learns it from GoAway, and Serve stops
			// accepting, then returns ErrShutdown once the other operations (whose
			// workloads the shutdown ended) have sent their exits.
			s.sess.GoAway()
			s.stopAccepting()
			_ = writeJSON(fw, FrameResult, result)
			lingerClose(st)
			return
		}
	}
	if err != nil {
		writeError(fw, err)
		return
	}
	_ = writeJSON(fw, FrameResult, result)
}

// errListFull stops a handler's listing once the request's limit is reached and it
// offers more.
var errListFull = errors.New("control: the listing reached its limit")

// serveList streams the handler's batches, never more than the request's limit in all, and
// ends with the end frame, which says whether the listing was cut. Neither side holds more
// than the limit, however large the directory.
func (s *server) serveList(ctx context.Context, fw *frameWriter, req *FileRequest) error {
	limit, sent := req.EffectiveLimit(), 0
	truncated := false
	err := s.h.List(ctx, req, func(batch []FileInfo) error {
		if len(batch) == 0 {
			return nil
		}
		if sent == limit {
			truncated = true
			return errListFull
		}
		if len(batch) > limit-sent {
			batch, truncated = batch[:limit-sent], true
		}
		sent += len(batch)
		if err := writeJSON(fw, FrameData, batch); err != nil {
			return err
		}
		if truncated {
			return errListFull
		}
		return nil
	})
	if err != nil && !(truncated && errors.Is(err, errListFull)) {
		return err
	}
	var end []byte
	if truncated {
		end, _ = json.Marshal(ListEnd{Truncated: true})
	}
	fw.write(FrameEnd, end)
	return nil
}

func (s *server) serveRead(ctx context.Context, fw *frameWriter, req *FileRequest) error {
	rc, size, err := s.h.ReadFile(ctx, req)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := writeJSON(fw, FrameResult, ReadResult{Size: size}); err != nil {
		return nil
	}
	// Exactly size bytes: what the file gained since it was opened is not sent, and a file
	// that lost bytes is an error, not a short read the client would take for the whole.
	var content io.Reader = rc
	left := int64(0)
	if size != UnknownSize {
		content, left = io.LimitReader(rc, size), size
	}
	buf := make([]byte, frameHeaderSize+chunkSize)
	for {
		if ctx.Err() != nil {
			return nil // the client is gone: nobody to tell
		}
		n, err := io.ReadFull(content, buf[frameHeaderSize:])
		if n > 0 {
			left -= int64(n)
			if werr := fw.writePrepared(FrameData, buf[:frameHeaderSize+n]); werr != nil {
				return nil
			}
		}
		if (err == io.EOF || err == io.ErrUnexpectedEOF) && left > 0 {
			writeError(fw, &RemoteError{Code: CodeFileChanged, Message: fmt.Sprintf("The file shrank by %d bytes while it was read.", left)})
			return nil
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			fw.write(FrameEnd, nil)
			return nil
		}
		if err != nil {
			slog.Warn("control: reading a file failed", "path", req.Path, "err", err)
			writeError(fw, &RemoteError{Code: CodeInternal, Message: "Reading the file failed part way."})
			return nil
		}
	}
}

// dataReader yields the payloads of data frames until the end frame.
type dataReader struct {
	st   io.Reader
	buf  []byte
	rest []byte
	done bool
}

func (d *dataReader) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.done {
			return 0, io.EOF
		}
		t, payload, err := ReadFrame(d.st, d.buf)
		if err != nil {
			// The client went away (or broke the framing) before the end frame.
			return 0, io.ErrUnexpectedEOF
		}
		d.buf = payload[:0]
		switch t {
		case FrameData:
			d.rest = payload
		case FrameEnd:
			d.done = true
		default:
			return 0, io.ErrUnexpectedEOF
		}
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

func (s *server) serveWrite(ctx context.Context, st *yamux.Stream, fw *frameWriter, req *FileRequest) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A session that dies while the handler waits for data must unblock the reader.
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	defer stop()
	dr := &dataReader{st: st}
	n, err := s.h.WriteFile(ctx, req, dr)
	if err != nil {
		writeError(fw, err)
		return
	}
	_ = writeJSON(fw, FrameResult, WriteResult{Size: n})
}

func writeJSON(fw *frameWriter, t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return fw.write(t, b)
}

func writeError(fw *frameWriter, err error) {
	re := asRemote(err)
	if re.Code == CodeInternal {
		slog.Warn("control: operation failed", "err", err)
	}
	_ = writeJSON(fw, FrameError, re)
}
