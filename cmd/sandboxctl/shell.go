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
	fs := flag.NewFlagSet("shell", flag.ContinueOnError)
	user := fs.String("user", "", "user or root")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		return errors.New("shell needs a sandbox id")
	}
	id, command := fs.Arg(0), commandArgs(fs.Args()[1:])
	if len(command) == 0 {
		command = []string{"/bin/sh"}
	}
	stdinFD := int(os.Stdin.Fd())
	tty := term.IsTerminal(stdinFD)
	q := url.Values{"command": command}
	if *user != "" {
		q.Set("user", *user)
	}
	if tty {
		q.Set("tty", "true")
		if cols, rows, err := term.GetSize(stdinFD); err == nil {
			q.Set("rows", strconv.Itoa(rows))
			q.Set("cols", strconv.Itoa(cols))
		}
	}
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
			return check(resp.StatusCode, body[:n])
		}
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
	var writeMu sync.Mutex // gorilla allows one writer at a time
	write := func(kind int, data []byte) error {
		writeMu.Lock()
		defer writeMu.Unlock()
		return conn.WriteMessage(kind, data)
	}
	if tty {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if cols, rows, err := term.GetSize(stdinFD); err == nil {
					b, _ := json.Marshal(map[string]any{"type": "resize", "rows": rows, "cols": cols})
					_ = write(websocket.TextMessage, b)
				}
			}
		}()
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 {
				if write(websocket.BinaryMessage, append([]byte{0}, buf[:n]...)) != nil {
					return
				}
			}
			if err != nil {
				_ = write(websocket.TextMessage, []byte(`{"type":"eof"}`))
				return
			}
		}
	}()
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
				// The deferred Restore runs before main exits with the code.
				return exitCode(m.ExitCode)
			}
		}
	}
}
