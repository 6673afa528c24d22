package handlers

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/websocket"

	"github.com/sandboxd/sandboxd/control"
	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/store"
)

// Websocket timing and sizes (see gorilla/websocket's command example for the pattern).
const (
	writeWait      = 10 * time.Second   // to write one message
	pongWait       = 60 * time.Second   // a client silent this long is gone
	pingPeriod     = pongWait * 9 / 10  // pings keep a healthy client within pongWait
	maxMessageSize = 1<<20 + 1          // one stdin frame: a stream byte and up to 1 MiB
	outputChunk    = 256 << 10          // output is sent in frames of at most this much
	streamTimeout  = 3600 * time.Second // the default and largest timeout_ms of a stream
	closeGrace     = 100 * time.Millisecond
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

// exitMessage is the server's last text frame.
type exitMessage struct {
	Type     string  `json:"type"`
	ExitCode int     `json:"exit_code"`
	Signal   *string `json:"signal"`
	TimedOut bool    `json:"timed_out"`
}

// ExecStream serves GET /v1/sandboxes/{id}/exec/stream. The request is validated against the
// contract and admitted (exec lock taken, workload started) before the upgrade, so that every
// refusal is an ordinary problem response. After the upgrade, the workload belongs to the
// connection: when the client goes away (or stops answering pings), the workload is killed,
// as a terminal's hang-up would. Use the buffered exec, or nohup inside the sandbox, for work
// that must outlive its client.
func (h *Handlers) ExecStream(w http.ResponseWriter, r *http.Request) error {
	if !websocket.IsWebSocketUpgrade(r) {
		return errcode.Invalid("Upgrade", "This route is a websocket; connect with a websocket client.")
	}
	id := chi.URLParam(r, "id")
	if err := store.ValidateID(id); err != nil {
		return err
	}
	creq, wait, err := parseStreamQuery(r)
	if err != nil {
		return err
	}
	admission, err := h.sup.AdmitExec(r.Context(), id, wait)
	if err != nil {
		return err
	}
	defer admission.Release()
	start := time.Now()
	proc, err := admission.Agent.Exec(r.Context(), creq)
	if err != nil {
		err = workloadLost(id, admission.Agent, err)
		h.execDone("stream", start, false, err)
		return err
	}
	defer proc.Close()

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
	timedOut, err := runStream(conn, admission.Agent, proc, h.log.With("sandbox", id))
	h.execDone("stream", start, timedOut, err)
	return nil
}

func parseStreamQuery(r *http.Request) (control.ExecRequest, time.Duration, error) {
	q := r.URL.Query()
	req := control.ExecRequest{
		Argv:      q["command"],
		Env:       q["env"],
		Cwd:       q.Get("cwd"),
		User:      q.Get("user"),
		Stdin:     true,
		TimeoutMS: streamTimeout.Milliseconds(),
	}
	if len(req.Argv) == 0 {
		return req, 0, errcode.Invalid("command", "Name the program to run with one or more command parameters.")
	}
	var err error
	if v := q.Get("tty"); v != "" {
		if req.TTY, err = strconv.ParseBool(v); err != nil {
			return req, 0, errcode.Invalid("tty", "tty must be true or false.")
		}
	}
	num := func(name string, min, max int64) (int64, bool, error) {
		v := q.Get(name)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < min || n > max {
			return 0, false, errcode.Invalid(name, "%s must be a whole number from %d to %d.", name, min, max)
		}
		return n, true, nil
	}
	if n, ok, err := num("rows", 1, 1000); err != nil {
		return req, 0, err
	} else if ok {
		req.Rows = uint16(n)
	}
	if n, ok, err := num("cols", 1, 1000); err != nil {
		return req, 0, err
	} else if ok {
		req.Cols = uint16(n)
	}
	if n, ok, err := num("timeout_ms", 1, streamTimeout.Milliseconds()); err != nil {
		return req, 0, err
	} else if ok {
		req.TimeoutMS = n
	}
	wait := defaultExecWait
	if n, ok, err := num("wait_ms", 1, 3600000); err != nil {
		return req, 0, err
	} else if ok {
		wait = time.Duration(n) * time.Millisecond
	}
	return req, wait, nil
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

// runStream pumps a workload's streams over an upgraded connection until the workload ends
// (exit message, normal close) or the client goes away (the workload is killed). It returns
// how the workload ended, for the exec metrics.
func runStream(conn *websocket.Conn, agent *control.Client, proc *control.Process, log *slog.Logger) (timedOut bool, _ error) {
	defer conn.Close()
	var clientGone sync.Once
	gone := func() { clientGone.Do(func() { proc.Close() }) }

	// Pings, on a timer. WriteControl may run concurrently with the one writer below.
	stopPings, pingsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pingsDone)
		ping := time.NewTicker(pingPeriod)
		defer ping.Stop()
		for {
			select {
			case <-ping.C:
				if err := conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
					gone()
				}
			case <-stopPings:
				return
			}
		}
	}()

	// The reader: stdin and control messages from the client.
	go func() {
		conn.SetReadLimit(maxMessageSize)
		_ = conn.SetReadDeadline(time.Now().Add(pongWait))
		conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(pongWait)) })
		for {
			kind, data, err := conn.ReadMessage()
			if err != nil {
				var ce *websocket.CloseError
				if !errors.As(err, &ce) || ce.Code != websocket.CloseNormalClosure {
					log.Debug("exec stream: client gone", "err", err)
				}
				gone()
				return
			}
			switch kind {
			case websocket.BinaryMessage:
				if len(data) == 0 || data[0] != streamStdin {
					continue // only stdin flows from the client; ignore the rest
				}
				if proc.Stdin != nil {
					if _, err := proc.Stdin.Write(data[1:]); err != nil {
						log.Debug("exec stream: stdin", "err", err)
					}
				}
			case websocket.TextMessage:
				var m controlMessage
				if json.Unmarshal(data, &m) != nil {
					continue
				}
				switch m.Type {
				case "resize":
					if m.Rows > 0 && m.Cols > 0 {
						_ = proc.Resize(m.Rows, m.Cols)
					}
				case "signal":
					_ = proc.Signal(m.Signal)
				case "eof":
					if proc.Stdin != nil {
						_ = proc.Stdin.Close()
					}
				}
			}
		}
	}()

	// The one writer: the output in the order the agent sent it, straight from the read
	// buffer, then the exit. Once a write failed the client is gone; the output is still
	// read to its end (which Close makes quick) so that the exec ends.
	var writeErr error
	write := func(kind int, data []byte) {
		if writeErr != nil {
			return
		}
		_ = conn.SetWriteDeadline(time.Now().Add(writeWait))
		if writeErr = conn.WriteMessage(kind, data); writeErr != nil {
			gone()
		}
	}
	small := smallChunks.Get().(*[1 + smallChunk]byte)
	defer smallChunks.Put(small)
	var large *[1 + outputChunk]byte
	buf := small[:]
	for {
		t, n, err := proc.ReadOutput(buf[1:])
		if n > 0 {
			buf[0] = streamStdout
			if t == control.FrameStderr {
				buf[0] = streamStderr
			}
			write(websocket.BinaryMessage, buf[:1+n])
		}
		if err != nil {
			break
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
	if large != nil {
		largeChunks.Put(large)
	}

	status, err := proc.Wait()
	if err == nil {
		msg := exitMessage{Type: "exit", ExitCode: status.ExitCode, TimedOut: status.TimedOut}
		if status.Signal != "" {
			sig := "SIG" + status.Signal
			msg.Signal = &sig
		}
		b, _ := json.Marshal(msg)
		write(websocket.TextMessage, b)
		write(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	} else {
		// Close codes other than 1000 carry the problem code as their reason: a workload
		// whose sandbox stopped under it goes away with not-running.
		code, reason := websocket.CloseInternalServerErr, string(errcode.Internal)
		if c := errcode.Of(workloadLost("", agent, err)); c == errcode.NotRunning {
			code, reason = websocket.CloseGoingAway, string(c)
		}
		write(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason))
	}
	close(stopPings)
	<-pingsDone
	// Give the client a moment to answer the close before the connection goes.
	_ = conn.SetReadDeadline(time.Now().Add(closeGrace))
	return err == nil && status.TimedOut, err
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
