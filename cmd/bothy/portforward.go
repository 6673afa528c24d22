package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bothy/bothy/sdk/go/bothy"
	"github.com/gorilla/websocket"
	"github.com/spf13/cobra"
)

// PortForwardOptions configure [PortForward].
type PortForwardOptions struct {
	URL, Token string
	Sandbox    string
	// Ports is "[LOCAL:]REMOTE"; LOCAL 0 picks a free port.
	Ports   string
	Address string
	// Log receives one line per listener and per failed connection.
	Log io.Writer
}

// PortForward serves the forward until ctx ends. Each local connection gets a tunnel of its
// own; a tunnel that cannot be opened (nothing listens in the sandbox, the sandbox stopped)
// closes that connection and is reported, and the forward goes on.
func PortForward(ctx context.Context, o PortForwardOptions) error {
	local, remote, err := parsePorts(o.Ports)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(o.Address, strconv.Itoa(local)))
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintf(o.Log, "Forwarding from %s -> %s:%d\n", ln.Addr(), o.Sandbox, remote)
	tunnel := strings.Replace(strings.Replace(o.URL, "https://", "wss://", 1), "http://", "ws://", 1) +
		"/v1/sandboxes/" + url.PathEscape(o.Sandbox) + "/ports/" + strconv.Itoa(remote) + "/tcp"
	header := http.Header{}
	if o.Token != "" {
		header.Set("Authorization", "Bearer "+o.Token)
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			if err := forwardOne(ctx, conn, tunnel, header); err != nil {
				fmt.Fprintf(o.Log, "port-forward: %v\n", err)
			}
		}()
	}
}

func parsePorts(s string) (local, remote int, err error) {
	l, r, found := strings.Cut(s, ":")
	if !found {
		r = l
	}
	if remote, err = strconv.Atoi(r); err != nil || remote < 1 || remote > 65535 {
		return 0, 0, fmt.Errorf("the remote port %q is not a port between 1 and 65535", r)
	}
	if local, err = strconv.Atoi(l); err != nil || local < 0 || local > 65535 {
		return 0, 0, fmt.Errorf("the local port %q is not a port between 0 and 65535", l)
	}
	return local, remote, nil
}

// forwardOne carries conn over one tunnel until either side ends.
func forwardOne(ctx context.Context, conn net.Conn, tunnel string, header http.Header) error {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ws, resp, err := websocket.DefaultDialer.DialContext(dctx, tunnel, header)
	cancel()
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			return bothy.ProblemOf(resp.StatusCode, body)
		}
		return err
	}
	defer ws.Close()
	stop := context.AfterFunc(ctx, func() { ws.Close(); conn.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if n > 0 {
				if werr := ws.WriteMessage(websocket.BinaryMessage, buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
				return
			}
		}
	}()
	for {
		typ, b, err := ws.ReadMessage()
		if err != nil {
			break
		}
		if typ == websocket.BinaryMessage {
			if _, err := conn.Write(b); err != nil {
				break
			}
		}
	}
	conn.Close()
	ws.Close()
	<-done
	return nil
}

// portForwardCommand is `bothy port-forward ID [LOCAL:]REMOTE`, as kubectl's.
func (c *cli) portForwardCommand() *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward ID [LOCAL:]REMOTE",
		Short: "Forward a local port to a port inside a sandbox, until interrupted",
		Long: "Forward a local port to 127.0.0.1:REMOTE inside the sandbox, over bothyd's TCP tunnel:\n" +
			"the sandbox needs no network. LOCAL defaults to REMOTE; 0 picks a free port.",
		Args:              exactArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			token, err := c.readToken()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return PortForward(ctx, PortForwardOptions{
				URL:     firstOf(c.url, os.Getenv("BOTHY_URL"), bothy.DefaultURL),
				Token:   token,
				Sandbox: args[0],
				Ports:   args[1],
				Address: address,
				Log:     c.stderr,
			})
		}),
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "the local address to listen on")
	return cmd
}
