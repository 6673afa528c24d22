package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// healthcheck asks a local bothyd for /healthz; it is the container's HEALTHCHECK, which has
// no curl. It dials loopback whatever address the server binds, since 0.0.0.0 is not an
// address one can dial on every system.
func healthcheck(stderr io.Writer) int {
	_, port, err := net.SplitHostPort(envOr("BOTHY_LISTEN", "127.0.0.1:7780"))
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort("127.0.0.1", port)+"/healthz", nil)
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(stderr, "healthcheck: /healthz answered", resp.Status)
		return 1
	}
	return 0
}
