package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"github.com/bothy/bothy/control"
)

var _ control.PortDialer = (*agent)(nil)

// DialPort connects to 127.0.0.1:port, in the network namespace the agent shares with the
// sandbox's workloads: the sandbox's own services, reached without any network interface
// beyond loopback. The address is fixed so that the operation can never become a way out of
// the sandbox to another host, whatever the sandbox's network allows.
func (a *agent) DialPort(ctx context.Context, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: control.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var timeout interface{ Timeout() bool }
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, &control.RemoteError{Code: control.CodePortRefused,
			Message: fmt.Sprintf("Nothing listens on port %d inside the sandbox (on 127.0.0.1); start the service there, or check its port and that it listens on 127.0.0.1 or 0.0.0.0.", port)}
	case errors.As(err, &timeout) && timeout.Timeout():
		return nil, &control.RemoteError{Code: control.CodePortRefused,
			Message: fmt.Sprintf("The service on port %d inside the sandbox did not accept the connection within %s; it is overloaded or stopped accepting.", port, control.DialTimeout)}
	}
	a.log.Warn("dialling a port failed", "port", port, "err", err)
	return nil, err
}
