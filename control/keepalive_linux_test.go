package control

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// frozenConn is the agent's end of a connection whose agent can be frozen: while it is, it
// reads nothing, as a frozen process reads nothing, and its socket's buffer takes what the
// client writes.
type frozenConn struct {
	net.Conn
	mu     sync.Mutex
	thawed *sync.Cond
	frozen bool
}

func newFrozenConn(c net.Conn) *frozenConn {
	f := &frozenConn{Conn: c}
	f.thawed = sync.NewCond(&f.mu)
	return f
}

func (f *frozenConn) Read(p []byte) (int, error) {
	f.mu.Lock()
	for f.frozen {
		f.thawed.Wait()
	}
	f.mu.Unlock()
	return f.Conn.Read(p)
}

func (f *frozenConn) set(frozen bool) {
	f.mu.Lock()
	f.frozen = frozen
	f.mu.Unlock()
	f.thawed.Broadcast()
}

// TestKeepaliveTellsAFrozenAgentFromADeadOne stops the agent's end of a session from reading:
// when the client is told the agent is frozen (a paused sandbox), the session outlives many
// keepalive intervals and works once the agent reads again; when it is not, the keepalive
// ends the session, as it must for an agent that died with its socket held open.
func TestKeepaliveTellsAFrozenAgentFromADeadOne(t *testing.T) {
	t.Parallel()
	const ka = 50 * time.Millisecond
	for _, frozen := range []bool{true, false} {
		client, agentEnd := unixPair(t)
		agent := newFrozenConn(agentEnd)
		conn, _ := serveOn(t, client, agent, newFake())
		c, err := dialWith(conn, capability, 5*time.Second, ka)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetFrozenCheck(func() bool { return frozen })

		agent.set(true)
		select {
		case <-c.Done():
			if frozen {
				t.Fatal("the keepalive ended the session of a frozen agent")
			}
		case <-time.After(40 * ka):
			if !frozen {
				t.Fatal("the keepalive kept the session of an agent that answers nothing")
			}
		}
		agent.set(false)
		if !frozen {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.Stats(ctx)
		cancel()
		if err != nil || st.Pids != 7 {
			t.Fatalf("after the thaw: Stats = %+v, %v; want the fake's", st, err)
		}
	}
}
