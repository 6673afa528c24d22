//go:build linux

package shim

import (
	"context"
	"crypto/rand"
	"encoding/binary"
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
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/guest"
	"github.com/bothy/bothy/runtime/microvm/portmux"
	"github.com/bothy/bothy/runtime/microvm/qmp"
)

const fdConfig = 3

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bothyd vmshim: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

func shimMain(args []string) int {
	// QEMU's parent-death signal fires when the THREAD that forked it exits: fork from the
	// main thread, which lives as long as the shim.
	goruntime.LockOSThread()
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "bothyd %s: want exactly one argument, the state directory\n", ShimCommand)
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

// vm is one launch: QEMU (one run of it, or one after another when the launch's memory is
// released and restored), the active port's mux, and the control socket.
type vm struct {
	cfg       *Config
	listening atomic.Bool // the control socket is made
	lnMu      sync.Mutex
	ln        *net.UnixListener
	nextID    atomic.Uint32

	// mu guards the current run: its QEMU, the active port's writer and session table (nil
	// while the memory is released), and the release's state.
	mu    sync.Mutex
	cmd   *exec.Cmd
	w     *portmux.Writer
	table *portmux.Table
	port  int
	// ready is signalled when the current run's guest listens.
	ready chan struct{}
	// releasing is set by a release before it quits QEMU, so that its end is no launch's end;
	// released while QEMU is gone with its memory saved, since releasedAt (CLOCK_BOOTTIME).
	releasing  bool
	released   bool
	releasedAt time.Duration
	resume     chan struct{}
	// stopped is set by a stop (a pause, a capture's hold) until the cont, since stoppedAt
	// (CLOCK_BOOTTIME): the guest's clock stands meanwhile, and the cont advances it.
	stopped   bool
	stoppedAt time.Duration

	// netns is the network namespace of a launch with a NIC, made by its first QEMU and kept
	// open for the launch's life: a release ends QEMU, and the namespace, which holds the
	// sandbox's eth0 (the veth's peer), its address and the host's filter on the veth, must
	// outlive it, so that the QEMU of the restore, started in it, finds the network as it was.
	// Only the run loop (the main thread) touches it.
	netns *os.File
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
	v := &vm{cfg: cfg, resume: make(chan struct{}, 1)}
	if err := v.listenShim(); err != nil {
		return fail("the shim's socket: %v", err)
	}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	term := make(chan os.Signal, 1)
	go v.onSignals(sigc, term)
	restore, port := cfg.Restore, cfg.Port
	var st *os.ProcessState
	for {
		cmd, err := v.startQEMU(restore, port)
		if err != nil {
			if !v.listening.Load() {
				return fail("%v", err)
			}
			logf("%v", err)
			outcome.Reason, outcome.ExitCode = runtime.ReasonStartFailed, -1
			break
		}
		st = v.wait(cmd)
		if !v.endRun(st) {
			break
		}
		// The memory is released: wait for its restore, or for the launch's end.
		select {
		case <-v.resume:
		case sig := <-term:
			logf("%v while the memory is released: the launch ends", sig)
			outcome.Reason, outcome.ExitCode, outcome.Signal = runtime.ReasonSignaled, -1, unix.SignalName(sig.(syscall.Signal))
			st = nil
		}
		if st == nil {
			break
		}
		v.mu.Lock()
		advance := boottime() - v.releasedAt
		restore, port = &Restore{Memory: filepath.Join(dir, EntryMemory, StateMemory), ClockAdvanceNS: int64(advance)}, 1-v.port
		v.mu.Unlock()
	}
	// The signals stay handled until the shim exits: a TERM now (a Kill that finds QEMU gone
	// already) must not end it before it has written the outcome.
	v.shut()
	if st != nil {
		if st.Exited() {
			outcome.Reason, outcome.ExitCode = runtime.ReasonExited, st.ExitCode()
		} else {
			ws, _ := st.Sys().(syscall.WaitStatus)
			outcome.Reason, outcome.ExitCode, outcome.Signal = runtime.ReasonSignaled, -1, unix.SignalName(ws.Signal())
		}
		if !v.listening.Load() {
			outcome.Reason = runtime.ReasonStartFailed
		}
	}
	logf("the VM ended: %s (exit code %d, signal %q)", outcome.Reason, outcome.ExitCode, outcome.Signal)
	outcome.At = time.Now().UTC()
	if err := runtime.WriteOutcome(dir, &outcome); err != nil {
		logf("write the outcome report: %v", err)
		return 1
	}
	return 0
}

// onSignals handles TERM, INT and HUP: while QEMU runs they ask the guest to end the sandbox
// gracefully (its agent's TERM), and the shim stays to record the outcome; while the memory
// is released they end the launch (to term).
func (v *vm) onSignals(sigc <-chan os.Signal, term chan<- os.Signal) {
	for sig := range sigc {
		v.mu.Lock()
		w, released := v.w, v.released
		v.mu.Unlock()
		if released {
			select {
			case term <- sig:
			default:
			}
			continue
		}
		logf("%v: asking the guest to shut down", sig)
		if w != nil {
			_ = w.WriteFrame(portmux.FrameShutdown, 0, nil)
		}
	}
}

// startQEMU starts a run of QEMU: a boot, or the restore of a saved memory state, serving on
// the given port.
func (v *vm) startQEMU(restore *Restore, port int) (*exec.Cmd, error) {
	var mine, theirs [2]*os.File
	for i := range mine {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("socketpair: %w", err)
		}
		mine[i], theirs[i] = os.NewFile(uintptr(fds[0]), "port"), os.NewFile(uintptr(fds[1]), "qemu port")
	}
	defer func() {
		for _, f := range theirs {
			f.Close()
		}
	}()
	cfg := *v.cfg
	cfg.Restore, cfg.Port = restore, port
	cmd := exec.Command(cfg.QEMU, QEMUArgs(&cfg, false)...) //nolint:noctx // QEMU lives as long as the sandbox
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{theirs[0], theirs[1]}
	if restore != nil {
		state, err := os.OpenFile(restore.Memory, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			mine[0].Close()
			mine[1].Close()
			return nil, fmt.Errorf("open the memory state: %w", err)
		}
		defer state.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, state)
	}
	var fsds []*fsd
	if len(cfg.Spec.Volumes) > 0 {
		if restore != nil {
			mine[0].Close()
			mine[1].Close()
			return nil, errors.New("a VM with volumes cannot be restored from a memory state: its virtio-fs devices are not migratable")
		}
		conns, started, err := v.startFSDs()
		if err != nil {
			mine[0].Close()
			mine[1].Close()
			return nil, err
		}
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		fsds = started
		// Fd 5 is a restore's stream, which this run has not: the connections start at
		// FSFirstFD.
		cmd.ExtraFiles = append(cmd.ExtraFiles, nil)
		cmd.ExtraFiles = append(cmd.ExtraFiles, conns...)
	}
	// QEMU dies with the shim, even by SIGKILL: nothing of a launch outlives its runtime
	// process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cfg.NIC && v.netns == nil {
		// The launch's first QEMU makes a network namespace of its own, which the shim keeps
		// (keepNetNS): the supervisor's network.Manager puts the sandbox's eth0 there, beside
		// QEMU's tap.
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	_ = os.Remove(cfg.QMP)
	logf("starting %s %q", cfg.QEMU, cmd.Args[1:])
	v.mu.Lock()
	if err := v.startIn(cmd, cfg.NIC); err != nil {
		v.mu.Unlock()
		stopFSDs(fsds)
		mine[0].Close()
		mine[1].Close()
		return nil, fmt.Errorf("start QEMU: %w", err)
	}
	w, table := portmux.NewWriter(mine[port]), portmux.NewTable()
	v.cmd, v.w, v.table, v.port, v.ready, v.released = cmd, w, table, port, make(chan struct{}), false
	v.mu.Unlock()
	if restore != nil {
		// Sent at once: the socket holds it until the restored guest, which was reading this
		// port when its state was saved, reads on.
		if err := v.sendRestore(w, restore); err != nil {
			_ = cmd.Process.Kill()
			return cmd, nil // the run's end is the launch's
		}
		go v.continueRestored(cmd, w, boottime())
	}
	// The other port carries nothing for this run: whatever the guest had half-written to it
	// before a save arrives here and is dropped.
	go func() { _, _ = io.Copy(io.Discard, mine[1-port]); mine[1-port].Close() }()
	go v.servePort(mine[port], w, table)
	return cmd, nil
}

// startIn starts QEMU: in the launch's network namespace when nic and one is kept (a restore
// after a release), and then keeps the namespace of a first run with a NIC. The namespace is
// the forking thread's, so the thread enters it for the fork and goes back after: this runs
// on the main thread, locked to the shim's main goroutine (shimMain), which no other
// goroutine runs on, and the Go runtime makes no new thread from a locked one.
func (v *vm) startIn(cmd *exec.Cmd, nic bool) error {
	if !nic || v.netns == nil {
		if err := cmd.Start(); err != nil {
			return err
		}
		if nic {
			return v.keepNetNS(cmd)
		}
		return nil
	}
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("open the shim's network namespace: %w", err)
	}
	defer self.Close()
	if err := unix.Setns(int(v.netns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the launch's network namespace: %w", err)
	}
	startErr := cmd.Start()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The shim would read as in the VM's namespace (its thread group leader's), so
		// NetNS would take the VM for one without a NIC: end this run, and so the launch.
		if startErr == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return fmt.Errorf("leave the launch's network namespace: %w", err)
	}
	return startErr
}

// keepNetNS opens the network namespace of the launch's first QEMU, which cmd just started
// in a namespace of its own, and keeps it. A QEMU that ends before (its start failed) ends
// the run, and so the launch: it is killed, and its end is the run's.
func (v *vm) keepNetNS(cmd *exec.Cmd) error {
	ns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net")
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("keep QEMU's network namespace: %w", err)
	}
	v.netns = ns
	return nil
}

// wait waits for a run of QEMU to end.
func (v *vm) wait(cmd *exec.Cmd) *os.ProcessState {
	err := cmd.Wait()
	if cmd.ProcessState == nil {
		logf("wait for QEMU: %v", err)
		return &os.ProcessState{}
	}
	return cmd.ProcessState
}

// endRun ends a run's sessions and reports whether it ended by a release of the memory (QEMU
// quit after its state was saved), which the launch outlives.
func (v *vm) endRun(st *os.ProcessState) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.table.Shut(errors.New("the VM ended"))
	v.w, v.table = nil, nil
	if v.releasing && st.Exited() && st.ExitCode() == 0 {
		v.releasing, v.released = false, true
		return true
	}
	v.releasing = false
	return false
}

// shut ends the control socket and the shim's once the launch is over.
func (v *vm) shut() {
	v.lnMu.Lock()
	if v.ln != nil {
		v.ln.Close()
	}
	v.lnMu.Unlock()
	_ = os.Remove(filepath.Join(v.cfg.Spec.Dir, EntryControl, SocketName))
	_ = os.Remove(filepath.Join(v.cfg.Spec.Dir, EntryControl, ShimSocketName))
}

// servePort reads the guest's frames of one run: the handshake (ready, then listening) and
// the sessions' data.
func (v *vm) servePort(port *os.File, w *portmux.Writer, table *portmux.Table) {
	defer port.Close()
	buf := make([]byte, portmux.MaxPayload)
	for {
		typ, id, p, err := portmux.ReadFrame(port, buf)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				logf("the port failed: %v", err)
			}
			table.Shut(err)
			return
		}
		switch typ {
		case portmux.FrameReady:
			if err := v.sendConfig(w); err != nil {
				logf("send the guest its configuration: %v", err)
			}
		case portmux.FrameListening:
			if v.listening.CompareAndSwap(false, true) {
				if err := v.listen(); err != nil {
					logf("control socket: %v", err)
					v.mu.Lock()
					_ = v.cmd.Process.Kill()
					v.mu.Unlock()
				}
			}
			v.mu.Lock()
			if v.w == w {
				select {
				case <-v.ready:
				default:
					close(v.ready)
				}
			}
			v.mu.Unlock()
		case portmux.FrameData, portmux.FrameClose:
			table.Dispatch(typ, id, p)
		}
	}
}

func (v *vm) sendConfig(w *portmux.Writer) error {
	s := &v.cfg.Spec
	vols := make([]guest.Volume, len(s.Volumes))
	for i, m := range s.Volumes {
		vols[i] = guest.Volume{Tag: guest.VolumeTag(i), Target: m.Target, ReadOnly: m.ReadOnly}
	}
	b, err := json.Marshal(guest.Config{Capability: s.Capability, Hostname: s.Hostname, Env: s.Env, MachineID: randomHex(16), Volumes: vols, RealtimeNS: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	return w.WriteFrame(portmux.FrameConfig, 0, b)
}

// sendRestore sends a restored guest what makes it this launch's: capability, host name,
// fresh entropy and the clock's advance, and a new machine id when the state is another
// launch's (a clone's restore; a launch that restores its own released memory keeps its id).
func (v *vm) sendRestore(w *portmux.Writer, r *Restore) error {
	s := &v.cfg.Spec
	entropy := make([]byte, 64)
	if _, err := rand.Read(entropy); err != nil {
		return err
	}
	msg := guest.Restore{Capability: s.Capability, Hostname: s.Hostname, Entropy: entropy, ClockAdvanceNS: r.ClockAdvanceNS}
	if r == v.cfg.Restore {
		msg.MachineID = randomHex(16)
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	return w.WriteFrame(portmux.FrameRestore, 0, b)
}

// restoreTimeout bounds the load of a saved state, after which the launch has failed.
const restoreTimeout = 5 * time.Minute

// continueRestored lets the restored guest run once QEMU has loaded its state: a state saved
// from a stopped VM (as a capture saves it) loads stopped. Its clock stood during the load,
// which began at started (CLOCK_BOOTTIME): that time is added to it (on w, after the restore
// frame's advance). A restore that does not get there ends QEMU, and so the launch.
func (v *vm) continueRestored(cmd *exec.Cmd, w *portmux.Writer, started time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	err := func() error {
		for {
			conn, err := (&net.Dialer{}).DialContext(ctx, "unix", v.cfg.QMP)
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
		_ = cmd.Process.Kill()
		return
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(boottime()-started))
	if err := w.WriteFrame(portmux.FrameClock, 0, b[:]); err != nil {
		logf("advance the restored guest's clock: %v", err)
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
		v.mu.Lock()
		w, table := v.w, v.table
		v.mu.Unlock()
		if w == nil {
			conn.Close() // the memory is released: no guest to carry it to
			continue
		}
		id := v.nextID.Add(1)
		mc := portmux.NewConn(id, w, table.Remove)
		if err := table.Add(mc); err != nil {
			conn.Close()
			continue
		}
		if err := w.WriteFrame(portmux.FrameOpen, id, nil); err != nil {
			conn.Close()
			table.Remove(mc)
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
