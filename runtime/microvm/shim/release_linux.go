//go:build linux

package shim

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/microvm/portmux"
	"github.com/bothy/bothy/runtime/microvm/qmp"
)

// The shim's own socket serves one request per line, JSON, and answers one [ShimReply]:
// {"op":"stop"} stops the VM's vCPUs (a pause, or a capture's hold); {"op":"cont"} lets them
// run on and advances the guest's clock by the time they stood, or, when the memory is
// released, restores it; {"op":"release"} saves the VM's memory into EntryMemory and ends
// QEMU, the launch living on; {"op":"resume"} restores released memory (a no-op otherwise) and
// answers once the guest listens again; {"op":"state"} says whether the memory is released.
type shimRequest struct {
	Op string `json:"op"`
}

// ShimReply is the shim's answer on its socket.
type ShimReply struct {
	Released bool   `json:"released"`
	Error    string `json:"error,omitempty"`
}

// boottime is CLOCK_BOOTTIME: it runs through a suspend of the host, as a time contract's
// downtime must, and the shim lives on one boot.
func boottime() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Duration(ts.Nano())
}

// listenShim makes the shim's socket in the control directory and serves it.
func (v *vm) listenShim() error {
	if err := os.MkdirAll(filepath.Join(v.cfg.Spec.Dir, EntryControl), 0o700); err != nil {
		return err
	}
	path := filepath.Join(v.cfg.Spec.Dir, EntryControl, ShimSocketName)
	_ = os.Remove(path)
	f, err := platform.ListenUnix(path, 0o600)
	if err != nil {
		return err
	}
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return err
	}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			v.serveShim(conn)
		}
	}()
	return nil
}

// serveShim answers one connection's requests, one at a time.
func (v *vm) serveShim(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		var req shimRequest
		var rep ShimReply
		if err := json.Unmarshal(line, &req); err != nil {
			rep.Error = "a request that does not decode"
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
			switch req.Op {
			case "stop":
				err = v.stop(ctx)
			case "cont":
				err = v.cont(ctx)
			case "release":
				err = v.release(ctx)
			case "resume":
				err = v.resumeReleased(ctx)
			case "state":
			default:
				err = fmt.Errorf("no op %q", req.Op)
			}
			cancel()
			if err != nil {
				rep.Error = err.Error()
			}
		}
		v.mu.Lock()
		rep.Released = v.released
		v.mu.Unlock()
		b, _ := json.Marshal(rep)
		if _, err := conn.Write(append(b, '\n')); err != nil {
			return
		}
	}
}

// release saves the running VM's memory and device state into EntryMemory (stopping it
// first) and ends QEMU; the launch lives on, released, until a resume restores it.
func (v *vm) release(ctx context.Context) error {
	v.mu.Lock()
	if v.released {
		v.mu.Unlock()
		return nil
	}
	if v.w == nil || v.releasing {
		v.mu.Unlock()
		return errors.New("the VM is not running")
	}
	port := v.port
	v.mu.Unlock()
	q, err := v.monitor(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	// The guest's clock stands from the stop (or the pause before it), not from the end of
	// the save: the save of a large memory takes seconds, and the resume advances the clock
	// over them too; a save that fails leaves a stopped VM whose cont advances it.
	if err := v.stopOn(ctx, q); err != nil {
		return err
	}
	if err := v.saveMemory(ctx, q, port); err != nil {
		return err
	}
	v.mu.Lock()
	v.releasing, v.releasedAt, v.stopped = true, v.stoppedAt, false
	v.mu.Unlock()
	logf("the memory is saved; QEMU quits")
	_, _ = q.Exec(ctx, "quit", nil, nil) // its answer may not come before it is gone
	for {
		v.mu.Lock()
		released, running := v.released, v.releasing
		v.mu.Unlock()
		if released {
			return nil
		}
		if !running {
			return errors.New("QEMU ended otherwise than by the release")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// monitor dials QEMU's monitor.
func (v *vm) monitor(ctx context.Context) (*qmp.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", v.cfg.QMP)
	if err != nil {
		return nil, fmt.Errorf("the monitor: %w", err)
	}
	return qmp.New(ctx, conn)
}

// stop stops the VM's vCPUs and notes since when its clock stands.
func (v *vm) stop(ctx context.Context) error {
	v.mu.Lock()
	if v.released || v.w == nil {
		v.mu.Unlock()
		return nil // no QEMU runs: nothing to stop
	}
	v.mu.Unlock()
	q, err := v.monitor(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	return v.stopOn(ctx, q)
}

// stopOn stops the VM's vCPUs through the monitor q and notes since when its clock stands,
// unless it stands already.
func (v *vm) stopOn(ctx context.Context, q *qmp.Conn) error {
	if _, err := q.Exec(ctx, "stop", nil, nil); err != nil {
		return err
	}
	v.mu.Lock()
	if !v.stopped {
		v.stopped, v.stoppedAt = true, boottime()
	}
	v.mu.Unlock()
	return nil
}

// cont lets a stopped VM run on (cancelling a save still streaming, a capture's whose
// bothyd died) and advances its clock by the time it stood; released memory is restored.
func (v *vm) cont(ctx context.Context) error {
	v.mu.Lock()
	released, running := v.released, v.w != nil
	v.mu.Unlock()
	if released {
		return v.resumeReleased(ctx)
	}
	if !running {
		return nil
	}
	q, err := v.monitor(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	st, err := q.Status(ctx)
	if err != nil {
		return err
	}
	switch st {
	case "running", "inmigrate", "prelaunch":
	case "finish-migrate":
		if _, err := q.Exec(ctx, "migrate_cancel", nil, nil); err != nil {
			return err
		}
		fallthrough
	default:
		if _, err := q.Exec(ctx, "cont", nil, nil); err != nil {
			return err
		}
	}
	v.mu.Lock()
	var stood time.Duration
	if v.stopped {
		stood, v.stopped = boottime()-v.stoppedAt, false
	}
	w := v.w
	v.mu.Unlock()
	if stood > 0 && w != nil {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(stood))
		return w.WriteFrame(portmux.FrameClock, 0, b[:])
	}
	return nil
}

// saveMemory writes the stopped VM's state into EntryMemory, anew, with its StateInfo.
func (v *vm) saveMemory(ctx context.Context, q *qmp.Conn, port int) error {
	dir := filepath.Join(v.cfg.Spec.Dir, EntryMemory)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, StateMemory), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := q.SaveTo(ctx, f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	res := v.cfg.Spec.Resources
	b, err := json.Marshal(StateInfo{Format: StateInfoFormat(v.cfg.NIC), Port: port, Accel: v.cfg.Accel, VCPUs: res.VCPUs, MemoryMB: res.MemoryMB, NIC: v.cfg.NIC})
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(dir, StateMeta, b, 0o600)
}

// resumeReleased restores a released VM and returns once its guest listens again; a VM whose
// memory is not released is left as it is.
func (v *vm) resumeReleased(ctx context.Context) error {
	v.mu.Lock()
	if !v.released {
		v.mu.Unlock()
		return nil
	}
	v.mu.Unlock()
	select {
	case v.resume <- struct{}{}:
	default:
	}
	for {
		v.mu.Lock()
		ready, restarted := v.ready, !v.released && v.w != nil
		v.mu.Unlock()
		if restarted {
			select {
			case <-ready:
				_ = os.RemoveAll(filepath.Join(v.cfg.Spec.Dir, EntryMemory))
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
