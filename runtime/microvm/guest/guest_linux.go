//go:build linux

package guest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/agent"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/microvm/portmux"
)

// devWait bounds how long the init waits for a device node to appear after its driver loaded.
const devWait = 30 * time.Second

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bothyd guest: %s\n", fmt.Sprintf(format, args...))
}

// Main is the guest's init (the initramfs's /init, run by the kernel with the argument
// [Command]). It returns only if it is not PID 1; as PID 1 it powers the VM off when the
// agent returns or a step fails, since PID 1 must never exit.
func Main(args []string) int {
	if os.Getpid() != 1 {
		logf("the guest init runs as PID 1 of a microVM only")
		return 2
	}
	err := run()
	if err != nil {
		logf("%v", err)
	}
	unix.Sync()
	// Power off ends QEMU; should ACPI be missing, a restart does (QEMU runs with -no-reboot).
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

func run() error {
	if err := mountEarly(); err != nil {
		return err
	}
	if err := loadModules(); err != nil {
		return err
	}
	port, err := openWhenPresent(PortDevices[0])
	if err != nil {
		return err
	}
	w := portmux.NewWriter(port)
	if err := w.WriteFrame(portmux.FrameReady, 0, nil); err != nil {
		return fmt.Errorf("port: %w", err)
	}
	cfg, err := readConfig(port)
	if err != nil {
		return err
	}
	if cfg.Probe {
		// A probe only asks whether this accelerator boots a guest at all.
		return w.WriteFrame(portmux.FrameListening, 0, nil)
	}
	if err := setClock(cfg.RealtimeNS); err != nil {
		return err
	}
	if err := switchRoot(); err != nil {
		return err
	}
	if err := setupRoot(cfg.Hostname, cfg.MachineID); err != nil {
		return err
	}
	if err := mountVolumes(cfg.Volumes); err != nil {
		return err
	}
	idle, err := openWhenPresent(PortDevices[1])
	if err != nil {
		return err
	}
	ln := newListener()
	ln.capability.Store(&cfg.Capability)
	ln.serveOn(0, port, w, true)
	ln.serveOn(1, idle, portmux.NewWriter(idle), false)
	if err := w.WriteFrame(portmux.FrameListening, 0, nil); err != nil {
		return fmt.Errorf("port: %w", err)
	}
	env := make([]string, 0, len(cfg.Env))
	for k, v := range cfg.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return agent.Run(agent.Config{
		Listener:       ln,
		CapabilityFunc: func() []byte { return *ln.capability.Load() },
		DefaultEnv:     env,
		Hostname:       cfg.Hostname,
		ReapAll:        true,
		// The guest's NIC is its own: the host gives the namespace's eth0 no more than layer 2.
		ConfigureNetwork: configureNIC,
	})
}

// mountEarly mounts what the initramfs needs: devtmpfs (the kernel makes the device nodes),
// proc and sysfs.
func mountEarly() error {
	for _, m := range []struct{ fstype, target string }{{"devtmpfs", "/dev"}, {"proc", "/proc"}, {"sysfs", "/sys"}} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.target, err)
		}
	}
	return nil
}

// loadModules loads the kernel modules of the initramfs in the order its ModulesOrder file
// lists them: each depends on those before it.
func loadModules() error {
	b, err := os.ReadFile(ModulesOrder)
	if err != nil {
		return err
	}
	for name := range strings.FieldsSeq(string(b)) {
		f, err := os.Open(filepath.Join(ModulesDir, name+".ko"))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

// openWhenPresent opens a device node once its driver made it.
func openWhenPresent(path string) (*os.File, error) {
	deadline := time.Now().Add(devWait)
	for {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readConfig reads the launch's configuration, the first frame the shim sends.
func readConfig(port *os.File) (*Config, error) {
	buf := make([]byte, portmux.MaxPayload)
	typ, _, p, err := portmux.ReadFrame(port, buf)
	if err != nil {
		return nil, fmt.Errorf("read the configuration: %w", err)
	}
	if typ != portmux.FrameConfig {
		return nil, fmt.Errorf("the first frame is of type %d, not the configuration", typ)
	}
	var cfg Config
	if err := json.Unmarshal(p, &cfg); err != nil {
		return nil, fmt.Errorf("decode the configuration: %w", err)
	}
	return &cfg, nil
}

// ext4ResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a mounted ext4 file system
// to the given number of blocks.
const ext4ResizeFS = 0x40086610

// growRoot grows the ext4 file system mounted at mnt to the size of its disk dev. The base disk
// is made as small as its content allows and the sandbox's overlay has its room beyond it
// (its disk_mb); growing a file system that fills its disk already is a no-op for the kernel.
func growRoot(mnt, dev string) error {
	d, err := os.Open(dev)
	if err != nil {
		return err
	}
	size, err := unix.IoctlGetUint64(int(d.Fd()), unix.BLKGETSIZE64)
	d.Close()
	if err != nil {
		return fmt.Errorf("the size of %s: %w", dev, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return err
	}
	if st.Bsize <= 0 {
		return fmt.Errorf("block size %d", st.Bsize)
	}
	blocks := size / uint64(st.Bsize)
	m, err := os.Open(mnt)
	if err != nil {
		return err
	}
	defer m.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, m.Fd(), ext4ResizeFS, uintptr(unsafe.Pointer(&blocks))); errno != 0 {
		return fmt.Errorf("EXT4_IOC_RESIZE_FS to %d blocks: %w", blocks, errno)
	}
	return nil
}

// switchRoot mounts the root disk and makes it /, with /dev, /proc and /sys moved along. The
// initramfs's files are removed first (the running init stays mapped), so that the memory
// they take goes back to the guest.
func switchRoot() error {
	if _, err := openWhenPresent(RootDevice); err != nil {
		return err
	}
	if err := os.MkdirAll("/newroot", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(RootDevice, "/newroot", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount the root disk: %w", err)
	}
	if err := growRoot("/newroot", RootDevice); err != nil {
		// The sandbox runs, with the room its base disk has: say so on the console.
		logf("growing the root file system to its disk: %v", err)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := os.MkdirAll("/newroot"+d, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(d, "/newroot"+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	ents, _ := os.ReadDir("/")
	for _, e := range ents {
		if e.Name() != "newroot" {
			_ = os.RemoveAll("/" + e.Name())
		}
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chdir("/")
}

// setupRoot mounts the rest of the sandbox's file system and gives it its host name and
// machine id.
func setupRoot(hostname, machineID string) error {
	for _, m := range []struct {
		fstype, target, data string
		perm                 os.FileMode
	}{
		{"devpts", "/dev/pts", "newinstance,ptmxmode=0666,mode=0620,gid=5", 0o755},
		{"tmpfs", "/dev/shm", "mode=1777", 0o1777},
		{"tmpfs", "/run", "mode=0755", 0o755},
	} {
		if err := os.MkdirAll(m.target, m.perm); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID|unix.MS_NODEV, m.data); err != nil {
			return fmt.Errorf("mount %s: %w", m.target, err)
		}
	}
	if err := os.Remove("/dev/ptmx"); err == nil || errors.Is(err, os.ErrNotExist) {
		_ = os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	if err := setIdentity(hostname, machineID); err != nil {
		return err
	}
	return platform.LoopbackUp()
}

// mountVolumes mounts the launch's volumes (virtio-fs, each served on the host by a virtiofsd
// of its own), nosuid and nodev, read-only as asked: the host's virtiofsd of a read-only
// volume serves a read-only view, so the guest's flag is a courtesy (a clear EROFS at once),
// not the enforcement. A volume that does not mount fails the launch rather than run the
// sandbox without it. The mount point is made in the guest's own root: a link on the way
// leads only elsewhere in the guest, which is the sandbox's own.
func mountVolumes(vols []Volume) error {
	for _, v := range vols {
		if err := os.MkdirAll(v.Target, 0o755); err != nil {
			return fmt.Errorf("the mount point of volume %s: %w", v.Target, err)
		}
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		if v.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount(v.Tag, v.Target, "virtiofs", flags, ""); err != nil {
			return fmt.Errorf("mount the volume at %s (virtio-fs %s): %w", v.Target, v.Tag, err)
		}
	}
	return nil
}

// setIdentity gives the guest its host name (the kernel's, /etc/hostname, /etc/hosts) and
// its machine id.
func setIdentity(hostname, machineID string) error {
	if err := platform.SetHostname(hostname); err != nil {
		return err
	}
	_ = os.WriteFile("/etc/hostname", []byte(hostname+"\n"), 0o644)
	_ = os.WriteFile("/etc/hosts", []byte("127.0.0.1\tlocalhost\n127.0.1.1\t"+hostname+"\n::1\tlocalhost\n"), 0o644)
	if machineID != "" {
		_ = os.Remove(MachineIDFile) // a link the sandbox made there is replaced, not followed
		if err := os.WriteFile(MachineIDFile, []byte(machineID+"\n"), 0o444); err != nil {
			return fmt.Errorf("write %s: %w", MachineIDFile, err)
		}
	}
	return nil
}

// applyRestore makes a guest that runs on from a memory state this launch's (see [Restore]).
func applyRestore(r *Restore) error {
	if err := advanceClock(r.ClockAdvanceNS); err != nil {
		return err
	}
	if err := addEntropy(r.Entropy); err != nil {
		return err
	}
	return setIdentity(r.Hostname, r.MachineID)
}

// setClock sets CLOCK_REALTIME to ns since the epoch, the host's clock (none when 0).
func setClock(ns int64) error {
	if ns <= 0 {
		return nil
	}
	ts := unix.NsecToTimespec(ns)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set the clock: %w", err)
	}
	return nil
}

// advanceClock adds ns to CLOCK_REALTIME: the guest's clock stood while its VM was stopped or
// saved.
func advanceClock(ns int64) error {
	if ns <= 0 {
		return nil
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return err
	}
	ts = unix.NsecToTimespec(ts.Nano() + ns)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("advance the clock: %w", err)
	}
	return nil
}

// addEntropy mixes b into the kernel's RNG and credits it (RNDADDENTROPY): a restored guest's
// pool is the saved one, shared with every other restore of that state.
func addEntropy(b []byte) error {
	if len(b) == 0 {
		return errors.New("the restore carries no entropy")
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(b)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(b)))
	copy(info[8:], b)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", e)
	}
	return nil
}

// listener accepts the host's sessions on the active port: each FrameOpen is one connection,
// that is one control session (yamux) of the supervisor's. Each port has its own session
// table; only the active port's frames are served, and a restore (on the idle port) makes
// the idle port the active one.
type listener struct {
	accept     chan *portmux.Conn
	done       chan struct{}
	once       sync.Once
	capability atomic.Pointer[[]byte]
	mu         sync.Mutex
	active     *port
}

// port is one of the two ports with its writer and session table.
type port struct {
	idx   int
	f     *os.File
	w     *portmux.Writer
	table *portmux.Table
}

func newListener() *listener {
	return &listener{accept: make(chan *portmux.Conn), done: make(chan struct{})}
}

// serveOn serves port idx (f, written through w) in the background; active makes it the one
// whose sessions are served.
func (l *listener) serveOn(idx int, f *os.File, w *portmux.Writer, active bool) {
	p := &port{idx: idx, f: f, w: w, table: portmux.NewTable()}
	if active {
		l.mu.Lock()
		l.active = p
		l.mu.Unlock()
	}
	go l.serve(p)
}

func (l *listener) isActive(p *port) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active == p
}

// serve reads a port's frames until it fails: the VM's end when it is the active port, else
// its reopening after a restore.
func (l *listener) serve(p *port) {
	buf := make([]byte, portmux.MaxPayload)
	for {
		typ, id, payload, err := portmux.ReadFrame(p.f, buf)
		if err != nil {
			p.table.Shut(err)
			if l.isActive(p) {
				logf("the port failed: %v", err)
				l.Close()
			}
			return
		}
		if typ == portmux.FrameRestore {
			l.restore(p, payload)
			continue
		}
		if !l.isActive(p) {
			continue // an idle port's stray bytes: nothing but a restore is taken from it
		}
		switch typ {
		case portmux.FrameOpen:
			c := portmux.NewConn(id, p.w, p.table.Remove)
			if err := p.table.Add(c); err != nil {
				logf("%v", err)
				continue
			}
			select {
			case l.accept <- c:
			case <-l.done:
				return
			}
		case portmux.FrameClock:
			if len(payload) == 8 {
				if err := advanceClock(int64(binary.BigEndian.Uint64(payload))); err != nil {
					logf("%v", err)
				}
			}
		case portmux.FrameShutdown:
			// The shim was asked to end the sandbox (its TERM): the agent shuts down as on
			// its own TERM, gracefully.
			_ = unix.Kill(os.Getpid(), unix.SIGTERM)
		case portmux.FrameData, portmux.FrameClose:
			p.table.Dispatch(typ, id, payload)
		}
	}
}

// restore takes a restore frame arriving on port p: the guest becomes the new launch's, p its
// active port, and the port active before, whose sessions belonged to the saved VM's host, is
// shut and reopened as the idle one (its close discards what was buffered of it).
func (l *listener) restore(p *port, payload []byte) {
	var r Restore
	if err := json.Unmarshal(payload, &r); err != nil || len(r.Capability) == 0 {
		logf("a restore frame that does not decode: %v", err)
		return
	}
	if err := applyRestore(&r); err != nil {
		logf("restore: %v", err)
	}
	l.capability.Store(&r.Capability)
	l.mu.Lock()
	old := l.active
	l.active = p
	l.mu.Unlock()
	if old != nil && old != p {
		old.table.Shut(errors.New("the VM was restored"))
		old.f.Close()
		if f, err := os.OpenFile(PortDevices[old.idx], os.O_RDWR, 0); err == nil {
			l.serveOn(old.idx, f, portmux.NewWriter(f), false)
		} else {
			logf("reopen %s: %v", PortDevices[old.idx], err)
		}
	}
	if err := p.w.WriteFrame(portmux.FrameListening, 0, nil); err != nil {
		logf("port: %v", err)
	}
}

// Accept implements net.Listener.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; the ports themselves stay open until the VM ends.
func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *listener) Addr() net.Addr { return portmux.Addr(0) }
