package control

import (
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

const (
	// helloTimeout bounds how long the agent waits for a new connection's hello, so a
	// connection that never authenticates does not hold a session open.
	helloTimeout = 10 * time.Second
	// headerTimeout bounds how long the agent waits for the header of an opened stream.
	headerTimeout = 10 * time.Second
	// closeLinger bounds how long a side waits for its peer to close a stream it finished.
	closeLinger = 5 * time.Second
	// streamWindow is yamux's per-stream receive window: how much one stream may have in
	// flight, and so what a side buffers at most per stream. 1 MiB keeps a unix socket busy
	// at several hundred MB/s while bounding memory per exec.
	streamWindow = 1 << 20
)

// keepAlive is how often each end pings the other, and how long a ping (or any write) may
// go unanswered before the session ends.
const keepAlive = 15 * time.Second

// yamuxConfig is the session configuration of both ends. Keepalives find a peer that went
// away without closing the connection (a killed sandbox, a half-dead socket), and the
// connection write timeout drops a session whose transport stopped draining. The agent's end
// uses yamux's keepalive; bothyd's end turns it off and runs its own ([Client.keepalive]),
// which knows that a frozen agent is silent, not dead.
func yamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.AcceptBacklog = 256
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = keepAlive
	cfg.ConnectionWriteTimeout = keepAlive
	cfg.MaxStreamWindowSize = streamWindow
	cfg.StreamOpenTimeout = 30 * time.Second
	cfg.StreamCloseTimeout = 30 * time.Second
	cfg.LogOutput = io.Discard
	return cfg
}
