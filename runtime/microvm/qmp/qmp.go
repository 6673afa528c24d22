// Package qmp is a client of QEMU's monitor protocol (QMP), as much of it as the microvm
// runtime drives: stop and cont, the run state, and saving a VM's state to a file (migrate to
// a descriptor passed with SCM_RIGHTS). The host-side driver dials the monitor socket safely
// and hands the connection over; the shim uses it to start a restored VM. It imports nothing
// of bothyd.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// DefaultTimeout bounds an exchange whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// Conn is a connection to a QEMU's monitor.
type Conn struct {
	conn *net.UnixConn
	r    *bufio.Reader
}

// New takes over conn, reads QEMU's greeting and leaves the capabilities negotiation.
func New(ctx context.Context, conn net.Conn) (*Conn, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("qmp: %T is not a unix socket connection", conn)
	}
	q := &Conn{conn: uc, r: bufio.NewReaderSize(conn, 64<<10)}
	q.deadline(ctx)
	if _, err := q.readReply(); err != nil {
		q.Close()
		return nil, fmt.Errorf("qmp: the greeting: %w", err)
	}
	if _, err := q.Exec(ctx, "qmp_capabilities", nil, nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// Close closes the connection.
func (q *Conn) Close() error { return q.conn.Close() }

func (q *Conn) deadline(ctx context.Context) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(DefaultTimeout)
	}
	_ = q.conn.SetDeadline(dl)
}

// Exec runs a command and returns its "return" value; fd, when not nil, travels with the
// command (SCM_RIGHTS), as getfd wants it.
func (q *Conn) Exec(ctx context.Context, cmd string, args any, fd *os.File) (json.RawMessage, error) {
	q.deadline(ctx)
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if fd != nil {
		_, _, err = q.conn.WriteMsgUnix(b, syscall.UnixRights(int(fd.Fd())), nil)
	} else {
		_, err = q.conn.Write(b)
	}
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	r, err := q.readReply()
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	return r, nil
}

// ErrCommand is a command that QEMU refused (an "error" reply).
var ErrCommand = errors.New("qmp: refused")

// readReply reads the next reply (a greeting, a return or an error), skipping events.
func (q *Conn) readReply() (json.RawMessage, error) {
	for {
		line, err := q.r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		var m struct {
			QMP    json.RawMessage `json:"QMP"`
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("a reply that does not decode: %w", err)
		}
		switch {
		case m.Error != nil:
			return nil, fmt.Errorf("%w: %s: %s", ErrCommand, m.Error.Class, m.Error.Desc)
		case m.Return != nil:
			return m.Return, nil
		case m.QMP != nil:
			return m.QMP, nil
		}
	}
}

// Status is the VM's run state (query-status): "running", "paused", "postmigrate",
// "inmigrate", ...
func (q *Conn) Status(ctx context.Context) (string, error) {
	r, err := q.Exec(ctx, "query-status", nil, nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(r, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// Migration is query-migrate's answer: Status "completed", "failed", "active", ...
type Migration struct {
	Status    string `json:"status"`
	ErrorDesc string `json:"error-desc"`
}

// Migration asks how the current save (migration) stands.
func (q *Conn) Migration(ctx context.Context) (Migration, error) {
	var m Migration
	r, err := q.Exec(ctx, "query-migrate", nil, nil)
	if err == nil {
		err = json.Unmarshal(r, &m)
	}
	return m, err
}

// SaveTo writes the VM's memory and device state to f (migrate to the file's descriptor)
// and waits until the stream is complete; ctx's end cancels it.
func (q *Conn) SaveTo(ctx context.Context, f *os.File) error {
	// The default bandwidth cap (128 MiB/s) is for a live migration over a network; a stopped
	// VM saved to a local file wants none.
	if _, err := q.Exec(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, "getfd", map[string]any{"fdname": "bothyd-save"}, f); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, "migrate", map[string]any{"uri": "fd:bothyd-save"}, nil); err != nil {
		return err
	}
	delay := time.Millisecond
	for {
		m, err := q.Migration(ctx)
		if err != nil {
			return err
		}
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("qmp: the save %s: %s", m.Status, m.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			_, _ = q.Exec(context.WithoutCancel(ctx), "migrate_cancel", nil, nil)
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
}

// ContinueRestored waits until QEMU has loaded an incoming state (-incoming) and lets the
// guest run: a state saved from a stopped VM loads stopped ("paused").
func (q *Conn) ContinueRestored(ctx context.Context) error {
	delay := time.Millisecond
	for {
		st, err := q.Status(ctx)
		if err != nil {
			return err
		}
		switch st {
		case "running":
			return nil
		case "paused", "postmigrate":
			_, err := q.Exec(ctx, "cont", nil, nil)
			return err
		case "inmigrate", "prelaunch", "restore-vm":
		default:
			return fmt.Errorf("qmp: the restored VM is %s", st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
}
