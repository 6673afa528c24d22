package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/gorilla/websocket"
	"golang.org/x/term"
)

// shell runs a command (default /bin/sh) in a sandbox over the exec websocket, wiring the
// local terminal to it: raw mode and a pseudo-terminal when stdin is a terminal, window size
// changes forwarded, and sandboxctl exiting with the command's exit code.
func (c *cli) shell(args []string) error {
	id, command, user, err := parseShell(args)
	if err != nil {
		return err
	}
	stdinFD := int(os.Stdin.Fd())
	tty := term.IsTerminal(stdinFD)
	conn, err := c.dialStream(id, streamQuery(command, user, tty, stdinFD))
	if err != nil {
		return err
	}
	defer conn.Close()

	if tty {
		old, err := term.MakeRaw(stdinFD)
		if err != nil {
			return err
		}
		defer func() { _ = term.Restore(stdinFD, old) }()
	}
	w := &streamWriter{conn: conn}
	if tty {
		defer forwardResizes(w, stdinFD)()
	}
	go pumpStdin(w)
	return readStream(conn)
}

// parseShell reads shell's flags and arguments: the sandbox, and the command to run in it.
func parseShell(args []string) (id string, command []string, user string, err error) {
	fs := flag.NewFlagSet("shell", flag.ContinueOnError)
	userFlag := fs.String("user", "", "user or root")
	if err := fs.Parse(args); err != nil {
		return "", nil, "", err
	}
	if fs.NArg() < 1 {
		return "", nil, "", errors.New("shell needs a sandbox id")
	}
	id, command = fs.Arg(0), commandArgs(fs.Args()[1:])
	if len(command) == 0 {
		command = []string{"/bin/sh"}
	}
	return id, command, *userFlag, nil
}

// streamQuery is the exec stream's query: the stream takes its whole request there, so that
// a refusal is an ordinary problem response before the upgrade. A terminal on stdin asks for
// a pseudo-terminal of the same size.
func streamQuery(command []string, user string, tty bool, stdinFD int) url.Values {
	q := url.Values{"command": command}
	if user != "" {
		q.Set("user", user)
	}
	if tty {
		q.Set("tty", "true")
		if cols, rows, err := term.GetSize(stdinFD); err == nil {
			q.Set("rows", strconv.Itoa(rows))
			q.Set("cols", strconv.Itoa(cols))
		}
	}
	return q
}

// dialStream opens the exec websocket of sandbox id. A refusal before the upgrade is reported
// as the API's error, as the other commands report theirs.
func (c *cli) dialStream(id string, q url.Values) (*websocket.Conn, error) {
	u := strings.Replace(strings.Replace(c.url, "https://", "wss://", 1), "http://", "ws://", 1)
	header := http.Header{}
	if c.token != "" {
		header.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.DefaultDialer.Dial(u+"/v1/sandboxes/"+url.PathEscape(id)+"/exec/stream?"+q.Encode(), header)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			body := make([]byte, 1<<16)
			n, _ := resp.Body.Read(body)
			return nil, check(resp.StatusCode, body[:n])
		}
		return nil, err
	}
	return conn, nil
}

// streamWriter serializes writes to the websocket: gorilla allows one writer at a time, and
// stdin and the resize forwarder both write.
type streamWriter struct {
	mu   sync.Mutex
	conn *websocket.Conn
}

func (w *streamWriter) write(kind int, data []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conn.WriteMessage(kind, data)
}

// forwardResizes sends a resize message whenever the local terminal's size changes, until
// the returned stop is called.
func forwardResizes(w *streamWriter, stdinFD int) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		for range winch {
			if cols, rows, err := term.GetSize(stdinFD); err == nil {
				b, _ := json.Marshal(map[string]any{"type": "resize", "rows": rows, "cols": cols})
				_ = w.write(websocket.TextMessage, b)
			}
		}
	}()
	return func() { signal.Stop(winch) }
}

// pumpStdin copies stdin to the command as stdin frames, and says eof when stdin ends. It
// returns when either side is done.
func pumpStdin(w *streamWriter) {
	buf := make([]byte, 32<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			if w.write(websocket.BinaryMessage, append([]byte{0}, buf[:n]...)) != nil {
				return
			}
		}
		if err != nil {
			_ = w.write(websocket.TextMessage, []byte(`{"type":"eof"}`))
			return
		}
	}
}

// readStream writes the command's output frames to stdout and stderr until the server
// closes the stream, and returns the command's exit code as an [exitCode] when it is not 0.
func readStream(conn *websocket.Conn) error {
	for {
		kind, data, err := conn.ReadMessage()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				return nil
			}
			return fmt.Errorf("the session ended: %w", err)
		}
		switch {
		case kind == websocket.BinaryMessage && len(data) > 0 && data[0] == 1:
			os.Stdout.Write(data[1:])
		case kind == websocket.BinaryMessage && len(data) > 0 && data[0] == 2:
			os.Stderr.Write(data[1:])
		case kind == websocket.TextMessage:
			var m struct {
				Type     string `json:"type"`
				ExitCode int    `json:"exit_code"`
			}
			if json.Unmarshal(data, &m) == nil && m.Type == "exit" && m.ExitCode != 0 {
				// The caller's deferred Restore runs before main exits with the code.
				return exitCode(m.ExitCode)
			}
		}
	}
}
