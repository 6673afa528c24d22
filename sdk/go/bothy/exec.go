package bothy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// ExecOptions are the optional parts of running a command.
type ExecOptions struct {
	// Env adds KEY=VALUE variables.
	Env []string
	// Cwd is the working directory (absolute); User is "user" (the default) or "root".
	Cwd, User string
	// Timeout kills the command after this long (0: the server's default).
	Timeout time.Duration
	// Wait is how long to wait for another exec on the sandbox to end (0: the default).
	Wait time.Duration
	// Stdin is the buffered exec's whole input; a [Stream] takes its input as it goes.
	Stdin string
	// TTY runs a streamed command on a pseudo-terminal of Rows by Cols (0: 24 by 80).
	TTY        bool
	Rows, Cols int
	// Umask is the command's file mode creation mask in octal, as the shell writes it
	// ("0077"); "" is the server's default, 0022.
	Umask string
}

// Exec runs a command and waits for it; its output comes back whole (up to the server's cap
// per stream, with the Truncated flags saying when it was cut).
func (c *Client) Exec(ctx context.Context, id string, command []string, o *ExecOptions) (*ExecResult, error) {
	if o == nil {
		o = &ExecOptions{}
	}
	body := struct {
		Command   []string `json:"command"`
		Env       []string `json:"env,omitempty"`
		Cwd       string   `json:"cwd,omitempty"`
		User      string   `json:"user,omitempty"`
		Stdin     *string  `json:"stdin,omitempty"`
		TimeoutMs int64    `json:"timeout_ms,omitempty"`
		WaitMs    int64    `json:"wait_ms,omitempty"`
		Umask     string   `json:"umask,omitempty"`
	}{Command: command, Env: o.Env, Cwd: o.Cwd, User: o.User, TimeoutMs: o.Timeout.Milliseconds(), WaitMs: o.Wait.Milliseconds(), Umask: o.Umask}
	if o.Stdin != "" {
		body.Stdin = &o.Stdin
	}
	var res ExecResult
	if err := c.post(ctx, sandboxPath(id, "/exec"), nil, body, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Frame stream bytes of the exec websocket.
const (
	streamStdin  = 0
	streamStdout = 1
	streamStderr = 2
)

// Stream is a command running over the exec websocket. Read its output with [Stream.Recv] (or
// copy it all with [Stream.Copy]) from one goroutine; write its input with [Stream.Write],
// [Stream.CloseStdin], [Stream.Resize] and [Stream.Signal] from any. The command is killed
// when the stream is closed before it ends, as a terminal hang-up would.
type Stream struct {
	conn *websocket.Conn

	wmu sync.Mutex // gorilla allows one writer at a time

	exit *Exit
}

// Chunk is a piece of the command's output.
type Chunk struct {
	// Stderr tells the stream: false for stdout (all output, with a tty), true for stderr.
	Stderr bool
	Data   []byte
}

// Exit is how a streamed command ended.
type Exit struct {
	Code     int     `json:"exit_code"`
	Signal   *string `json:"signal"`
	TimedOut bool    `json:"timed_out"`
}

// ExecStream starts a command over the exec websocket. A refusal (the sandbox is not running,
// another exec holds it past o.Wait) is the API's error, before anything runs.
func (c *Client) ExecStream(ctx context.Context, id string, command []string, o *ExecOptions) (*Stream, error) {
	if o == nil {
		o = &ExecOptions{}
	}
	q := url.Values{"command": command}
	for _, e := range o.Env {
		q.Add("env", e)
	}
	if o.Cwd != "" {
		q.Set("cwd", o.Cwd)
	}
	if o.User != "" {
		q.Set("user", o.User)
	}
	if o.Umask != "" {
		q.Set("umask", o.Umask)
	}
	if o.TTY {
		q.Set("tty", "true")
		if o.Rows > 0 && o.Cols > 0 {
			q.Set("rows", strconv.Itoa(o.Rows))
			q.Set("cols", strconv.Itoa(o.Cols))
		}
	}
	if o.Timeout > 0 {
		q.Set("timeout_ms", millis(o.Timeout))
	}
	if o.Wait > 0 {
		q.Set("wait_ms", millis(o.Wait))
	}
	u := c.url(sandboxPath(id, "/exec/stream"), q)
	u = "ws" + strings.TrimPrefix(u, "http") // http→ws, https→wss
	header := http.Header{}
	c.authorize(header)
	dialer := *websocket.DefaultDialer
	if c.http.Transport != nil {
		if t, ok := c.http.Transport.(*http.Transport); ok {
			dialer.TLSClientConfig = t.TLSClientConfig
			dialer.NetDialContext = t.DialContext
		}
	}
	conn, resp, err := dialer.DialContext(ctx, u, header)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			return nil, readProblem(resp)
		}
		return nil, c.transportError(err)
	}
	return &Stream{conn: conn}, nil
}

func (s *Stream) write(kind int, data []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.conn.WriteMessage(kind, data)
}

func (s *Stream) control(msg any) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	return s.write(websocket.TextMessage, b)
}

// Write sends p to the command's stdin.
func (s *Stream) Write(p []byte) (int, error) {
	if err := s.write(websocket.BinaryMessage, append([]byte{streamStdin}, p...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseStdin ends the command's stdin (it reads end of file).
func (s *Stream) CloseStdin() error { return s.control(map[string]string{"type": "eof"}) }

// Resize sets the pseudo-terminal's size (a tty stream only).
func (s *Stream) Resize(rows, cols int) error {
	return s.control(map[string]any{"type": "resize", "rows": rows, "cols": cols})
}

// Signal sends a signal ("SIGINT", "SIGTERM", ...) to the command.
func (s *Stream) Signal(name string) error {
	return s.control(map[string]string{"type": "signal", "signal": name})
}

// Recv returns the next piece of output. After the command's exit it returns io.EOF, and
// [Stream.Exit] says how it ended; a stream that ends otherwise returns the cause.
func (s *Stream) Recv() (Chunk, error) {
	for {
		kind, data, err := s.conn.ReadMessage()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				if s.exit != nil {
					return Chunk{}, io.EOF
				}
				return Chunk{}, errors.New("bothyd: the exec stream closed before the command's exit")
			}
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return Chunk{}, &APIError{Code: Code(ce.Text), Detail: fmt.Sprintf("The exec stream was closed by the server (%d).", ce.Code)}
			}
			return Chunk{}, err
		}
		switch {
		case kind == websocket.BinaryMessage && len(data) > 0 && data[0] == streamStdout:
			return Chunk{Data: data[1:]}, nil
		case kind == websocket.BinaryMessage && len(data) > 0 && data[0] == streamStderr:
			return Chunk{Stderr: true, Data: data[1:]}, nil
		case kind == websocket.TextMessage:
			var m struct {
				Type string `json:"type"`
				Exit
			}
			if json.Unmarshal(data, &m) == nil && m.Type == "exit" {
				e := m.Exit
				s.exit = &e
			}
		}
	}
}

// Exit is how the command ended, once [Stream.Recv] has returned io.EOF; nil before.
func (s *Stream) Exit() *Exit { return s.exit }

// Copy writes the command's output to stdout and stderr until it exits, and returns its
// exit.
func (s *Stream) Copy(stdout, stderr io.Writer) (*Exit, error) {
	for {
		ch, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return s.exit, nil
		}
		if err != nil {
			return nil, err
		}
		w := stdout
		if ch.Stderr {
			w = stderr
		}
		if _, err := w.Write(ch.Data); err != nil {
			return nil, err
		}
	}
}

// Close ends the stream; a command still running is killed.
func (s *Stream) Close() error { return s.conn.Close() }
