//go:build linux

package shim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/microvm/guest"
	"github.com/sandboxd/sandboxd/runtime/microvm/portmux"
	"github.com/sandboxd/sandboxd/runtime/microvm/qmp"
)

const fdConfig = 3

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s sandboxd vmshim: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

func shimMain(args []string) int {
	// QEMU's parent-death signal fires when the THREAD that forked it exits: fork from the
	// main thread, which lives as long as the shim.
	goruntime.LockOSThread()
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "sandboxd %s: want exactly one argument, the state directory\n", ShimCommand)
		return 2
	}
	f := os.NewFile(fdConfig, "config")
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	f.Close()
	var cfg Config
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		logf("read configuration: %v", err)
		return 2
	}
	if cfg.Spec.Dir != args[0] {
		logf("configuration names %s, argv %s", cfg.Spec.Dir, args[0])
		return 2
	}
	return run(&cfg)
}

// vm is one launch: QEMU, the port's mux, and the control socket.
type vm struct {
	cfg       *Config
	cmd       *exec.Cmd
	w         *portmux.Writer
	table     *portmux.Table
	listening atomic.Bool
	lnMu      sync.Mutex
	ln        *net.UnixListener
	nextID    atomic.Uint32
}

func run(cfg *Config) int {
	dir := cfg.Spec.Dir
	outcome := runtime.Outcome{LaunchID: cfg.Spec.LaunchID}
	fail := func(format string, args ...any) int {
		logf(format, args...)
		outcome.Reason, outcome.ExitCode, outcome.At = runtime.ReasonStartFailed, -1, time.Now().UTC()
		if err := runtime.WriteOutcome(dir, &outcome); err != nil {
			logf("write the outcome report: %v", err)
		}
		return 1
	}
	if cfg.Port != 0 && cfg.Port != 1 || cfg.Restore == nil && cfg.Port != 0 {
		return fail("port %d: a boot serves on port 0, a restore on port 0 or 1", cfg.Port)
	}
	var mine, theirs [2]*os.File
	for i := range mine {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fail("socketpair: %v", err)
		}
		mine[i], theirs[i] = os.NewFile(uintptr(fds[0]), "port"), os.NewFile(uintptr(fds[1]), "qemu port")
	}
	active := mine[cfg.Port]
	v := &vm{cfg: cfg, w: portmux.NewWriter(active), table: portmux.NewTable()}
	v.cmd = exec.Command(cfg.QEMU, QEMUArgs(cfg, false)...) //nolint:noctx // QEMU lives as long as the sandbox
	v.cmd.Dir = "/"
	v.cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	v.cmd.Stdout, v.cmd.Stderr = os.Stdout, os.Stderr
	v.cmd.ExtraFiles = []*os.File{theirs[0], theirs[1]}
	if cfg.Restore != nil {
		state, err := os.OpenFile(cfg.Restore.Memory, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail("open the memory state: %v", err)
		}
		defer state.Close()
		v.cmd.ExtraFiles = append(v.cmd.ExtraFiles, state)
	}
	// QEMU dies with the shim, even by SIGKILL: nothing of a launch outlives its runtime
	// process.
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf("starting %s %q", cfg.QEMU, v.cmd.Args[1:])
	if err := v.cmd.Start(); err != nil {
		return fail("start QEMU: %v", err)
	}
	for _, f := range theirs {
		f.Close()
	}
	if cfg.Restore != nil {
		// Sent at once: the socket holds it until the restored guest, which was reading this
		// port when its state was saved, reads on.
		if err := v.sendRestore(); err != nil {
			_ = v.cmd.Process.Kill()
			_ = v.cmd.Wait()
			return fail("send the restore: %v", err)
		}
		go v.continueRestored()
	}
	// The other port carries nothing for this launch: whatever the guest had half-written to
	// it before a save arrives here and is dropped.
	go func() { _, _ = io.Copy(io.Discard, mine[1-cfg.Port]) }()
	go v.servePort(active)
	st := v.wait()
	v.shut()
	if st.Exited() {
		outcome.Reason, outcome.ExitCode = runtime.ReasonExited, st.ExitCode()
	} else {
		ws, _ := st.Sys().(syscall.WaitStatus)
		outcome.Reason, outcome.ExitCode, outcome.Signal = runtime.ReasonSignaled, -1, unix.SignalName(ws.Signal())
	}
	if !v.listening.Load() {
		outcome.Reason = runtime.ReasonStartFailed
	}
	logf("the VM ended: %s (exit code %d, signal %q)", outcome.Reason, outcome.ExitCode, outcome.Signal)
	outcome.At = time.Now().UTC()
	if err := runtime.WriteOutcome(dir, &outcome); err != nil {
		logf("write the outcome report: %v", err)
		return 1
	}
	return 0
}

// wait waits for QEMU to end. TERM, INT or HUP to the shim ask the guest to end the sandbox
// gracefully (its agent's TERM); the shim stays to record the outcome.
func (v *vm) wait() *os.ProcessState {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for sig := range sigc {
			logf("%v: asking the guest to shut down", sig)
			_ = v.w.WriteFrame(portmux.FrameShutdown, 0, nil)
		}
	}()
	err := v.cmd.Wait()
	signal.Stop(sigc)
	if v.cmd.ProcessState == nil {
		logf("wait for QEMU: %v", err)
		return &os.ProcessState{}
	}
	return v.cmd.ProcessState
}

// shut ends the control socket and every session once QEMU is gone.
func (v *vm) shut() {
	v.lnMu.Lock()
	if v.ln != nil {
		v.ln.Close()
	}
	v.lnMu.Unlock()
	v.table.Shut(errors.New("the VM ended"))
	_ = os.Remove(filepath.Join(v.cfg.Spec.Dir, EntryControl, SocketName))
}

// servePort reads the guest's frames: the handshake (ready, then listening) and the sessions'
// data.
func (v *vm) servePort(port *os.File) {
	buf := make([]byte, portmux.MaxPayload)
	for {
		typ, id, p, err := portmux.ReadFrame(port, buf)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				logf("the port failed: %v", err)
			}
			v.table.Shut(err)
			return
		}
		switch typ {
		case portmux.FrameReady:
			if err := v.sendConfig(); err != nil {
				logf("send the guest its configuration: %v", err)
			}
		case portmux.FrameListening:
			if v.listening.CompareAndSwap(false, true) {
				if err := v.listen(); err != nil {
					logf("control socket: %v", err)
					_ = v.cmd.Process.Kill()
				}
			}
		case portmux.FrameData, portmux.FrameClose:
			v.table.Dispatch(typ, id, p)
		}
	}
}

func (v *vm) sendConfig() error {
	s := &v.cfg.Spec
	b, err := json.Marshal(guest.Config{Capability: s.Capability, Hostname: s.Hostname, Env: s.Env, MachineID: randomHex(16)})
	if err != nil {
		return err
	}
	return v.w.WriteFrame(portmux.FrameConfig, 0, b)
}

// sendRestore sends a restored guest what makes it this launch's: capability, host name,
// a new machine id, fresh entropy and the clock's advance.
func (v *vm) sendRestore() error {
	s := &v.cfg.Spec
	entropy := make([]byte, 64)
	if _, err := rand.Read(entropy); err != nil {
		return err
	}
	b, err := json.Marshal(guest.Restore{Capability: s.Capability, Hostname: s.Hostname, MachineID: randomHex(16),
		Entropy: entropy, ClockAdvanceNS: v.cfg.Restore.ClockAdvanceNS})
	if err != nil {
		return err
	}
	return v.w.WriteFrame(portmux.FrameRestore, 0, b)
}

// restoreTimeout bounds the load of a saved state, after which the launch has failed.
const restoreTimeout = 5 * time.Minute

// continueRestored lets the restored guest run once QEMU has loaded its state: a state saved
// from a stopped VM (as a capture saves it) loads stopped. A restore that does not get there
// ends QEMU, and so the launch.
func (v *vm) continueRestored() {
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	err := func() error {
		for {
			conn, err := net.Dial("unix", v.cfg.QMP)
			if err == nil {
				q, err := qmp.New(ctx, conn)
				if err != nil {
					return err
				}
				defer q.Close()
				return q.ContinueRestored(ctx)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the monitor: %w", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	if err != nil {
		logf("the restore did not run: %v", err)
		_ = v.cmd.Process.Kill()
	}
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// listen makes the control socket, only now that the agent accepts sessions (the supervisor
// waits for the socket to appear), and accepts on it.
func (v *vm) listen() error {
	f, err := platform.ListenUnix(filepath.Join(v.cfg.Spec.Dir, EntryControl, SocketName), 0o600)
	if err != nil {
		return err
	}
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return err
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	v.lnMu.Lock()
	v.ln = ul
	v.lnMu.Unlock()
	go v.acceptLoop(ul)
	return nil
}

func (v *vm) acceptLoop(ln *net.UnixListener) {
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		id := v.nextID.Add(1)
		mc := portmux.NewConn(id, v.w, v.table.Remove)
		if err := v.table.Add(mc); err != nil {
			conn.Close()
			continue
		}
		if err := v.w.WriteFrame(portmux.FrameOpen, id, nil); err != nil {
			conn.Close()
			v.table.Remove(mc)
			continue
		}
		go splice(conn, mc)
	}
}

// splice copies a connection's bytes to its session and back; the end of either direction
// ends both.
func splice(conn *net.UnixConn, mc *portmux.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(mc, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, mc); done <- struct{}{} }()
	<-done
	conn.Close()
	mc.Close()
	<-done
}
