package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/bothy/bothy/internal/systemd"
)

// readyPoll is how often notifyReady asks /healthz until it answers. The listener is bound
// before the server serves, so the first or second try normally answers.
const readyPoll = 20 * time.Millisecond

// notifyReady tells systemd that bothyd is ready once its own /healthz answers 200 on addr,
// the listener's address: a unit ordered after bothyd.service, or a `systemctl start` that
// waits, then finds the API serving rather than a bound socket whose server may still fail.
// It does nothing where no service manager asked for notifications (NOTIFY_SOCKET unset), and
// gives up when ctx ends first.
func notifyReady(ctx context.Context, addr net.Addr, log *slog.Logger) {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	url := "http://" + dialable(addr) + "/healthz"
	client := &http.Client{Timeout: 2 * time.Second}
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for !healthy(ctx, client, url) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	if _, err := systemd.Ready("serving on " + addr.String()); err != nil {
		log.Warn("cannot tell systemd that bothyd is ready; the unit's start will time out", "err", err)
		return
	}
	log.Debug("told systemd that bothyd is ready")
}

// notifyStopping tells systemd that bothyd has begun to shut down.
func notifyStopping(log *slog.Logger) {
	if _, err := systemd.Stopping(); err != nil {
		log.Warn("cannot tell systemd that bothyd is stopping", "err", err)
	}
}

func healthy(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil) //nolint:gosec // G704: our own address
	if err != nil {
		return false
	}
	resp, err := client.Do(req) //nolint:gosec // G704: our own address
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// dialable is the host:port to reach a listener at: its own address, or loopback of the same
// family when it listens on every address, which not every system can dial.
func dialable(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return addr.String()
	}
	ip := net.IPv4(127, 0, 0, 1)
	if tcp.IP.To4() == nil {
		ip = net.IPv6loopback
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(tcp.Port))
}
