package handlers

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi/stream"
	"github.com/bothy/bothy/supervisor"
)

// Websocket timing and sizes (see gorilla/websocket's command example for the pattern).
const (
	writeWait      = 10 * time.Second  // to write one message
	pongWait       = 60 * time.Second  // a client silent this long is gone
	pingPeriod     = pongWait * 9 / 10 // pings keep a healthy client within pongWait
	maxMessageSize = 1<<20 + 1         // one stdin frame: a stream byte and up to 1 MiB
	outputChunk    = 256 << 10         // output is sent in frames of at most this much
	closeGrace     = 100 * time.Millisecond
)

// Defaults of the stream's optional query parameters, as openapi.yaml declares them: the
// server's validator enforces the contract's bounds before the handler runs, but applies no
// defaults. TestStreamDefaultsAreTheContracts holds them to the spec.
const (
	defaultStreamRows    = 24
	defaultStreamCols    = 80
	defaultStreamTimeout = 3600 * time.Second
	// wait_ms defaults to defaultExecWait, as a buffered exec's does.
)

// The first byte of a binary frame names its stream.
const (
	streamStdin  = 0
	streamStdout = 1
	streamStderr = 2
)

// controlMessage is a text frame: resize, signal and eof from the client; exit from the server.
type controlMessage struct {
	Type   string `json:"type"`
	Rows   uint16 `json:"rows,omitempty"`
	Cols   uint16 `json:"cols,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// errorMessage answers a frame of the client's that the server could not act on.
type errorMessage struct {
	Type   string `json:"type"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// exitMessage is the server's last text frame.
type exitMessage struct {
	Type     string  `json:"type"`
	ExitCode int     `json:"exit_code"`
	Signal   *string `json:"signal"`
	TimedOut bool    `json:"timed_out"`
	OOM      bool    `json:"oom_killed"`
}

// ExecStream serves GET /v1/sandboxes/{id}/exec/stream. The request is validated against the
// contract (by the server, before this runs), bound from the query by the code generated for
// the operation (package openapi/stream), and admitted (exec lock taken, workload started)
// before the upgrade, so that every refusal is an ordinary problem response. After the
// upgrade, the workload belongs to the connection: when the client goes away (or stops
// answering pings), the workload is killed, as a terminal's hang-up would. Use the buffered
// exec, or nohup inside the sandbox, for work that must outlive its client.
func (h *Handlers) ExecStream(w http.ResponseWriter, r *http.Request) error {
	if !websocket.IsWebSocketUpgrade(r) {
		return errcode.Invalid("Upgrade", "This route is a websocket; connect with a websocket client.")
	}
	var err error
	bind := stream.ServerInterfaceWrapper{
		Handler: streamFunc(func(w http.ResponseWriter, r *http.Request, id string, p stream.ExecStreamParams) {
			err = h.execStream(w, r, id, p)
		}),
		ErrorHandlerFunc: func(_ http.ResponseWriter, _ *http.Request, bindErr error) { err = paramError(bindErr) },
	}
	bind.ExecStream(w, r)
	return err
}

// streamFunc adapts a function to the generated stream.ServerInterface.
type streamFunc func(w http.ResponseWriter, r *http.Request, id string, p stream.ExecStreamParams)

func (f streamFunc) ExecStream(w http.ResponseWriter, r *http.Request, id stream.SandboxIDPath, p stream.ExecStreamParams) {
	f(w, r, id, p)
}

// paramError explains a query parameter that does not bind to its declared type.
func paramError(err error) error {
	var required *stream.RequiredParamError
	var invalid *stream.InvalidParamFormatError
	switch {
	case errors.As(err, &required):
		e := errcode.Invalid(required.ParamName, "The query parameter %q is required; add it.", required.ParamName)
		e.Err = err
		return e
	case errors.As(err, &invalid):
		e := errcode.Invalid(invalid.ParamName, "The query parameter %q is not of its type (see /openapi.yaml): %v.", invalid.ParamName, invalid.Err)
		e.Err = err
		return e
	}
	return errcode.Wrap(errcode.InvalidRequest, err, "The query could not be decoded: %v.", err)
}

// streamRequest is the workload and admission wait of a stream, with the contract's defaults
// for what the query leaves out. Its bounds are the contract's, checked before binding.
func streamRequest(p stream.ExecStreamParams) (supervisor.ExecRequest, time.Duration) {
	req := supervisor.ExecRequest{
		Argv:    p.Command,
		Cwd:     deref(p.Cwd),
		User:    userOf(p.User),
		Rows:    defaultStreamRows,
		Cols:    defaultStreamCols,
		Timeout: defaultStreamTimeout,
	}
	if p.Env != nil {
		req.Env = *p.Env
	}
	if p.Tty != nil {
		req.TTY = *p.Tty
	}
	if p.Rows != nil {
		req.Rows = uint16(*p.Rows)
	}
	if p.Cols != nil {
		req.Cols = uint16(*p.Cols)
	}
	if p.TimeoutMs != nil {
		req.Timeout = time.Duration(*p.TimeoutMs) * time.Millisecond
	}
	wait := defaultExecWait
	if p.WaitMs != nil {
		wait = time.Duration(*p.WaitMs) * time.Millisecond
	}
	return req, wait
}

// execStream admits and starts the workload, upgrades the connection and runs the stream.
func (h *Handlers) execStream(w http.ResponseWriter, r *http.Request, id string, p stream.ExecStreamParams) error {
	if err := checkProgram(p.Command); err != nil {
		return err
	}
	req, wait := streamRequest(p)
	var err error
	if req.Umask, err = parseUmask(p.Umask); err != nil {
		return err
	}
	release, err := h.bounds.admitExec()
	if err != nil {
		return err
	}
	defer release()
	admission, err := h.sup.AdmitExec(r.Context(), id, wait)
	if err != nil {
		return err
	}
	defer admission.Release()
	start := time.Now()
	session, err := h.sup.StartExec(r.Context(), admission, req)
	if err != nil {
		h.execDone("stream", start, false, err)
		return cwdFault(err)
	}
	defer session.Close()

	var upgradeErr error
	upgrader := websocket.Upgrader{
		ReadBufferSize: 32 << 10,
		// Output frames are written straight from their chunk buffers (WriteMessage copies
		// only what fits the write buffer and hands the rest to writev), so the write buffer
		// need only hold headers and the small text frames.
		WriteBufferSize: 4 << 10,
		// The server's middleware has checked Origin for every route, with its allow-list.
		CheckOrigin: func(*http.Request) bool { return true },
		Error: func(_ http.ResponseWriter, _ *http.Request, status int, reason error) {
			upgradeErr = errcode.Wrap(errcode.InvalidRequest, reason, "The websocket handshake failed: %v.", reason)
		},
	}
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		if upgradeErr != nil {
			return upgradeErr
		}
		return err
	}
	h.streams.add(conn)
	defer h.streams.remove(conn)
	timedOut, err := runStream(conn, session, h.log.With("sandbox", id))
	h.execDone("stream", start, timedOut, err)
	return nil
}

// Output buffers: a stream byte and the payload. A stream reads into a small one and moves
// to a large one while its reads fill the small one, so that a flood goes out in large frames
// (fewer writes and wake-ups per byte) and an idle or interactive stream holds little memory.
// Both are recycled across streams.
const smallChunk = 32 << 10

var (
	smallChunks = sync.Pool{New: func() any { return new([1 + smallChunk]byte) }}
	largeChunks = sync.Pool{New: func() any { return new([1 + outputChunk]byte) }}
)

// workload is what a stream relays: a [supervisor.Session].
type workload interface {
	WriteStdin(p []byte) error
	CloseStdin() error
	Resize(rows, cols uint16) error
	Signal(name string) error
	ReadOutput(p []byte) (supervisor.Stream, int, error)
	Wait() (supervisor.ExitStatus, error)
	Close() error
}

// streamConn is one upgraded connection and the workload it relays. Three goroutines share
// it: the pinger (WriteControl, which may run concurrently with the writer), the reader
// (stdin and control messages, and the error messages that answer bad ones), and the writer,
// the caller of runStream, which writes output, exit and close frames.
type streamConn struct {
	conn *websocket.Conn
	work workload
	log  *slog.Logger
	// gone kills the workload, once: the client is gone, or a write to it failed.
	gone     func()
	wmu      sync.Mutex
	writeErr error // the first failed write, under wmu
}

// runStream pumps a workload's streams over an upgraded connection until the workload ends
// (exit message, normal close) or the client goes away (the workload is killed). It returns
// how the workload ended, for the exec metrics.
func runStream(conn *websocket.Conn, work workload, log *slog.Logger) (timedOut bool, _ error) {
	defer conn.Close()
	var once sync.Once
	c := &streamConn{conn: conn, work: work, log: log}
	c.gone = func() { once.Do(func() { work.Close() }) }

	stopPings := c.ping()
	go c.read()
	c.pump()
	status, err := work.Wait()
	c.finish(status, err)
	stopPings()
	// Give the client a moment to answer the close before the connection goes.
	_ = conn.SetReadDeadline(time.Now().Add(closeGrace))
	return err == nil && status.TimedOut, err
}

// ping sends pings on a timer until the returned function is called; that function returns
// once the pinger has stopped.
func (c *streamConn) ping() (stop func()) {
	stopPings, pingsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pingsDone)
		ticker := time.NewTicker(pingPeriod)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				if err := c.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
					c.gone()
				}
			case <-stopPings:
				return
			}
		}
	}()
	return func() {
		close(stopPings)
		<-pingsDone
	}
}

// read relays stdin and control messages from the client until the connection fails or
// closes, and then kills the workload.
func (c *streamConn) read() {
	c.conn.SetReadLimit(maxMessageSize)
	_ = c.conn.SetReadDeadline(time.Now().Add(pongWait))
	c.conn.SetPongHandler(func(string) error { return c.conn.SetReadDeadline(time.Now().Add(pongWait)) })
	for {
		kind, data, err := c.conn.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.CloseNormalClosure {
				c.log.Debug("exec stream: client gone", "err", err)
			}
			c.gone()
			return
		}
		var refusal string
		switch kind {
		case websocket.BinaryMessage:
			// Only stdin flows from the client.
			if len(data) == 0 || data[0] != streamStdin {
				refusal = "a binary frame must start with stream byte 0 (stdin)"
				break
			}
			if err := c.work.WriteStdin(data[1:]); err != nil {
				c.log.Debug("exec stream: stdin", "err", err)
			}
		case websocket.TextMessage:
			refusal = c.control(data)
		}
		if refusal != "" {
			c.refuse(refusal)
		}
	}
}

// control applies a control message of the client's, or says why it cannot.
func (c *streamConn) control(data []byte) (refusal string) {
	var m controlMessage
	if json.Unmarshal(data, &m) != nil {
		return "a text frame must be one JSON control message"
	}
	switch m.Type {
	case "resize":
		if m.Rows == 0 || m.Cols == 0 {
			return "resize needs rows and cols of 1 or more"
		}
		_ = c.work.Resize(m.Rows, m.Cols)
	case "signal":
		if !signalNames[strings.TrimPrefix(m.Signal, "SIG")] {
			return "unknown signal name; use one such as SIGINT or SIGTERM"
		}
		_ = c.work.Signal(m.Signal)
	case "eof":
		_ = c.work.CloseStdin()
	default:
		return "unknown control message type; use resize, signal or eof"
	}
	return ""
}

// refuse answers a frame the server cannot act on with an error message, rather than ignore
// it and leave the client to believe it took effect; the session goes on.
func (c *streamConn) refuse(what string) {
	b, _ := json.Marshal(errorMessage{Type: "error", Code: string(errcode.InvalidRequest), Detail: "The frame was ignored: " + what + "."})
	c.write(websocket.TextMessage, b)
}

// signalNames are the Linux signals a client may send, without their SIG prefix.
var signalNames = map[string]bool{
	"HUP": true, "INT": true, "QUIT": true, "ILL": true, "TRAP": true, "ABRT": true, "BUS": true,
	"FPE": true, "KILL": true, "USR1": true, "SEGV": true, "USR2": true, "PIPE": true, "ALRM": true,
	"TERM": true, "STKFLT": true, "CHLD": true, "CONT": true, "STOP": true, "TSTP": true,
	"TTIN": true, "TTOU": true, "URG": true, "XCPU": true, "XFSZ": true, "VTALRM": true,
	"PROF": true, "WINCH": true, "IO": true, "PWR": true, "SYS": true,
}

// write sends one message. Once a write failed the client is gone: the workload is killed,
// and later writes are dropped. The writer and the reader (for its error messages) both
// write: wmu keeps their messages whole.
func (c *streamConn) write(kind int, data []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.writeErr != nil {
		return
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(writeWait))
	if c.writeErr = c.conn.WriteMessage(kind, data); c.writeErr != nil {
		c.gone()
	}
}

// pump sends the output in the order the agent sent it, straight from the read buffer, until
// the workload's output ends. After a failed write the output is still read to its end
// (which killing the workload makes quick), so that the exec ends.
func (c *streamConn) pump() {
	small := smallChunks.Get().(*[1 + smallChunk]byte)
	defer smallChunks.Put(small)
	var large *[1 + outputChunk]byte
	defer func() {
		if large != nil {
			largeChunks.Put(large)
		}
	}()
	buf := small[:]
	for {
		s, n, err := c.work.ReadOutput(buf[1:])
		if n > 0 {
			buf[0] = streamStdout
			if s == supervisor.Stderr {
				buf[0] = streamStderr
			}
			c.write(websocket.BinaryMessage, buf[:1+n])
		}
		if err != nil {
			return
		}
		switch {
		case n == len(buf)-1 && large == nil:
			large = largeChunks.Get().(*[1 + outputChunk]byte)
			buf = large[:]
		case n < smallChunk && large != nil:
			largeChunks.Put(large)
			large = nil
			buf = small[:]
		}
	}
}

// finish sends the exit message and a normal close, or, for a workload that ended without
// an exit status, a close whose code says why.
func (c *streamConn) finish(status supervisor.ExitStatus, err error) {
	if err == nil {
		msg := exitMessage{Type: "exit", ExitCode: status.ExitCode, TimedOut: status.TimedOut, OOM: status.OOM, Signal: signalName(status)}
		b, _ := json.Marshal(msg)
		c.write(websocket.TextMessage, b)
		c.write(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
		return
	}
	// Close codes other than 1000 carry the problem code as their reason: a workload whose
	// sandbox stopped under it goes away with not-running.
	code, reason := websocket.CloseInternalServerErr, string(errcode.Internal)
	if errcode.Of(err) == errcode.NotRunning {
		code, reason = websocket.CloseGoingAway, string(errcode.NotRunning)
	}
	c.write(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason))
}

// streamSet tracks open websockets so that a shutdown can tell them to go away.
type streamSet struct {
	mu    sync.Mutex
	conns map[*websocket.Conn]struct{}
}

func (s *streamSet) add(c *websocket.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		s.conns = map[*websocket.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
}

func (s *streamSet) remove(c *websocket.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// CloseStreams tells every open exec websocket that the server is going away (close code
// 1001) and closes it; their workloads are killed, as for any client that leaves. The server
// calls it when a graceful shutdown begins.
func (h *Handlers) CloseStreams() {
	h.streams.mu.Lock()
	defer h.streams.mu.Unlock()
	for c := range h.streams.conns {
		_ = c.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseGoingAway, "server shutting down"), time.Now().Add(writeWait))
		c.Close()
	}
}

// userOf is the stream's user, or "" (the default user) when it names none.
func userOf(u *stream.User) string {
	if u == nil {
		return ""
	}
	return string(*u)
}
