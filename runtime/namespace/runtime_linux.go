//go:build linux

package namespace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/seccomp"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// DefaultResources are applied to a Spec's zero resources.
var DefaultResources = runtime.Resources{VCPUs: 1, MemoryMB: 512, Pids: 512}

// Config configures the runtime. Its zero value is the default configuration.
type Config struct {
	// Executable is the bothyd binary to re-execute as shim and init; "" means the running
	// executable (/proc/self/exe, which keeps working if the file is replaced on disk).
	Executable string
	// CgroupParent is the cgroup below which each sandbox gets <CgroupParent>/<shim.CgroupLeaf>
	// and, on cgroup v2, the shims start in <CgroupParent>/runtime (runtime.SpawnDetached); ""
	// means "bothy" (bothyd's --cgroup-parent).
	CgroupParent string
	// IDs are the host ids of the sandboxes' user namespaces; zero fields take the defaults
	// ([DefaultIDBase], [DefaultIDSlots], [DefaultIDRegistry]). IDs.Off runs sandboxes
	// without one (their ids are the host's), for state roots and images on file systems
	// that cannot be idmapped (overlayfs, NFS), and for measuring what the namespace costs.
	IDs shim.IDConfig
	// ReleaseSocket, unless empty, is where [Runtime.ServeReleases] takes the releases of
	// launches that ended, which each shim is told: an absolute path in a directory of this
	// user's that no one else may write.
	ReleaseSocket string
	// StateRoot, unless "", is the state root, whose file system the start-up probes try
	// idmapped mounts on (mechanisms_linux.go).
	StateRoot string
	// ForceFallbacks makes the start-up probes take each feature's fallback wherever it works
	// (overlay layers by path, tmpfs layers chowned rather than idmapped), whatever better
	// this kernel has: for tests, on a host whose kernel has everything (bothyd's
	// BOTHY_TEST_FORCE_FALLBACKS).
	ForceFallbacks bool
}

// The defaults of Config.IDs. Each running sandbox has 65536 host ids of its own
// (shim.IDRangeSize), slot n of a host-wide registry starting at DefaultIDBase+n*65536. The
// base, 0x70000000, lies above the ranges that useradd hands out in /etc/subuid and
// /etc/subgid (100000 to 600100000 + 65536 by default) and above systemd-nspawn's
// (0x00080000-0x6FFFFFFF), and the slots end below systemd's foreign range (0x7FFE0000)
// and below 2^31, where signed id bugs live; a slot that /etc/subuid or /etc/subgid still
// hands to a user is skipped. The registry is a lock file on /run, shared by every bothyd
// of the host, so that sandboxes of two state roots never share a range either.
const (
	DefaultIDBase     = 0x70000000
	DefaultIDSlots    = (0x7FFE0000 - DefaultIDBase) / shim.IDRangeSize
	DefaultIDRegistry = "/run/bothyd/idranges.lock"
)

// Runtime is the namespace runtime. Create it with New.
type Runtime struct {
	cfg      Config
	identity func() (string, error)
	// seccomp is the compiled filter of every sandbox, in its binary form: compiled once
	// here, since the sandbox side links no compiler.
	seccomp []byte
	// refusal, when set, is why this runtime cannot start sandboxes (no root, or a kernel
	// without a feature they need: kernelRefusal).
	refusal error
	// kernelRefusal is why this host's kernel cannot run sandboxes, found by the start-up
	// probes; probe is what they found and chose.
	kernelRefusal error
	probe         mountProbe
	// diskTemplates are the empty disk images that sandboxes' disks are copied from
	// ([Runtime.diskTemplate]), under diskMu.
	diskMu        sync.Mutex
	diskTemplates map[diskTemplateKey]*os.File
	diskOrder     []diskTemplateKey // oldest first
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns the namespace runtime. Without root it still serves everything but Start, which
// it refuses with errcode.Unavailable: the rootless variant (a user namespace with mapped ids)
// is not implemented, and a server that cannot start sandboxes is still useful to look at its
// state root, its templates and its API.
func New(cfg Config) (*Runtime, error) {
	var refusal error
	if os.Geteuid() != 0 {
		refusal = errcode.New(errcode.Unavailable, "This bothyd runs without root, so it cannot start sandboxes; run it as root (or with CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETUID, CAP_SETGID and write access to the cgroup hierarchy). Rootless sandboxes are not supported yet.")
	}
	if cfg.Executable == "" {
		cfg.Executable = "/proc/self/exe"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "bothy"
	}
	if cfg.IDs.Base == 0 {
		cfg.IDs.Base = DefaultIDBase
	}
	if cfg.IDs.Slots == 0 {
		cfg.IDs.Slots = DefaultIDSlots
	}
	if cfg.IDs.Registry == "" {
		cfg.IDs.Registry = DefaultIDRegistry
	}
	if _, err := platform.OpenCgroup(cfg.CgroupParent + "/probe"); err != nil {
		return nil, fmt.Errorf("namespace runtime: %w", err)
	}
	// On cgroup v2 the agent clones workloads into their cgroup with clone3, which Docker's
	// profile refuses (seccomp.DefaultWithClone3 says why allowing it is safe).
	compile := seccomp.Default
	if v, err := platform.CgroupVersion(); err == nil && v == 2 {
		compile = seccomp.DefaultWithClone3
	}
	prog, err := compile(platform.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("namespace runtime: %w", err)
	}
	bpf, err := prog.MarshalBinary()
	if err != nil {
		return nil, err
	}
	r := &Runtime{cfg: cfg, seccomp: bpf, refusal: refusal}
	if refusal == nil {
		// Once, before any sandbox: every start uses what these choose (Start passes it
		// to each shim).
		r.probe = probeMounts(cfg)
		r.kernelRefusal = r.probe.refusal
		r.refusal = r.probe.refusal
	}
	r.identity = sync.OnceValues(r.computeIdentity)
	return r, nil
}

// ServeReleases listens at Config.ReleaseSocket and takes there, until the returned stop is
// called, the releases that shims hand over when their launch has ended
// ([shim.ServeReleases]): a stop then starts no releaser process. Only the server calls it (a
// checker that made the same runtime must not take the server's socket). failed is told of
// each hand-off refused.
func (r *Runtime) ServeReleases(failed func(error)) (stop func(), err error) {
	if !filepath.IsAbs(r.cfg.ReleaseSocket) {
		return nil, fmt.Errorf("namespace runtime: the release socket %q is no absolute path", r.cfg.ReleaseSocket)
	}
	f, err := platform.ListenUnix(r.cfg.ReleaseSocket, 0o600)
	if err != nil {
		return nil, fmt.Errorf("namespace runtime: %w", err)
	}
	defer f.Close()
	fl, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("namespace runtime: the release socket: %w", err)
	}
	l, ok := fl.(*net.UnixListener)
	if !ok {
		fl.Close()
		return nil, fmt.Errorf("namespace runtime: the release socket is no unix socket")
	}
	// The socket stays when the listener closes: a shim that ends later finds nothing
	// listening and starts a releaser, and the next server's listen replaces it.
	l.SetUnlinkOnClose(false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		shim.ServeReleases(l, failed)
	}()
	return func() { l.Close(); <-done }, nil
}

// Mechanisms are the mount mechanisms the start-up probes chose for this kernel.
func (r *Runtime) Mechanisms() runtime.Mechanisms { return r.probe.report }

// ProbeNotes are what the start-up probes found beyond their choice (why a better mechanism
// was not taken), for the log.
func (r *Runtime) ProbeNotes() []string { return r.probe.notes }

// KernelRefusal says why this host's kernel cannot run sandboxes of this runtime (nil if it
// can), in a message that names the kernel, the feature and what to do: found once, by the
// start-up probes.
func (r *Runtime) KernelRefusal() error { return r.kernelRefusal }

// Kind returns "namespace".
func (r *Runtime) Kind() string { return Kind }

func (r *Runtime) computeIdentity() (string, error) {
	f, err := os.Open(r.cfg.Executable)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	cfg, _ := json.Marshal(struct {
		Config
		Defaults runtime.Resources
	}{Config{CgroupParent: r.cfg.CgroupParent}, DefaultResources})
	h.Write([]byte{0})
	h.Write(cfg)
	return fmt.Sprintf("%s/p%d/%s", Kind, control.ProtocolVersion, hex.EncodeToString(h.Sum(nil))[:24]), nil
}

// Identity is "namespace/p<control protocol>/<hash of the executable and configuration>".
func (r *Runtime) Identity() string {
	id, err := r.identity()
	if err != nil {
		// An unreadable executable cannot match any recorded identity; say so in the value.
		return fmt.Sprintf("%s/p%d/unknown", Kind, control.ProtocolVersion)
	}
	return id
}

// DeclaredEntries lists the names the runtime keeps in a state directory.
func (r *Runtime) DeclaredEntries() []runtime.Entry { return declaredEntries() }

// OpenLayer implements runtime.Runtime: the overlay's upper, in the state directory or on the
// sandbox's own disk.
func (r *Runtime) OpenLayer(dir string, disk bool) (*os.File, error) {
	if disk {
		return openDiskLayer(dir)
	}
	return platform.OpenDir(filepath.Join(dir, shim.EntryUpper))
}

// ControlPath returns the host path of the control socket of the sandbox in dir. The shim
// makes it, in a directory that is nowhere inside the sandbox, and listens on it (the agent
// accepts on the inherited descriptor), so the peer credentials of a connection to it are
// the shim's, the process whose identity Start returns.
func (r *Runtime) ControlPath(dir string) string {
	return filepath.Join(dir, shim.EntryControl, shim.SocketName)
}

func (r *Runtime) cgroupName(id, dir string) string {
	return r.cfg.CgroupParent + "/" + shim.CgroupLeaf(id, dir)
}

// VolumeSupport implements runtime.VolumeMounter: the shim clones each volume's host mount,
// idmapped by the sandbox's user namespace, into the sandbox's root (shim.rootMounts).
func (r *Runtime) VolumeSupport() error { return r.refusal }

// DiskSupport implements runtime.DiskLimiter: a sandbox's own disk is an ext4 file system
// (made by mke2fs) in a sparse image, mounted through a loop device inside the sandbox.
func (r *Runtime) DiskSupport() error {
	_, err := r.diskTool()
	return err
}

// diskTool checks what a disk of a sandbox's own needs and returns the mke2fs to make one.
func (r *Runtime) diskTool() (string, error) {
	if r.refusal != nil {
		return "", r.refusal
	}
	if fi, err := os.Stat(platform.LoopControl); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return "", fmt.Errorf("no loop devices: %s is missing", platform.LoopControl)
	}
	return mke2fs()
}

// mke2fs finds the mke2fs program (e2fsprogs), also where a PATH without sbin would miss it.
func mke2fs() (string, error) {
	if p, err := exec.LookPath("mke2fs"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mke2fs", "/sbin/mke2fs"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("mke2fs (e2fsprogs) is not installed")
}

// ensureDiskImage makes the sandbox's disk image, an empty ext4 file system of sizeMB, as a
// sparse copy of the file that template returns (see [Runtime.diskTemplate]; closed here),
// unless the image exists. It is made under a temporary name and renamed into place once
// complete and synced, so that a crash never leaves a half-made image under the real name;
// leftovers of an interrupted attempt go first.
func ensureDiskImage(dir string, sizeMB int, template func() (*os.File, error)) error {
	img := filepath.Join(dir, shim.EntryDiskImage)
	if fi, err := os.Lstat(img); err == nil {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("namespace runtime: %s is not a regular file", img)
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if name, ok := platform.IsTempName(e.Name()); ok && name == shim.EntryDiskImage {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	tmpl, err := template()
	if err != nil {
		return err
	}
	defer tmpl.Close()
	if fi, err := tmpl.Stat(); err != nil || fi.Size() != int64(sizeMB)<<20 {
		return fmt.Errorf("namespace runtime: the disk template is not of %d MiB (%v)", sizeMB, err)
	}
	tmp := filepath.Join(dir, platform.TempName(shim.EntryDiskImage))
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // a no-op once renamed
	defer f.Close()
	if err := copySparse(f, tmpl); err != nil {
		return fmt.Errorf("namespace runtime: copying the disk template: %w", err)
	}
	// The image must be whole before its name is: a crash after an unsynced rename could
	// leave disk.img all holes, a disk that no longer mounts.
	if err := f.Sync(); err != nil {
		return err
	}
	if err := os.Rename(tmp, img); err != nil {
		return err
	}
	d, err := platform.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return platform.SyncDir(d)
}

// maxDiskTemplates bounds the disk templates a runtime keeps, one per size asked for.
const maxDiskTemplates = 8

// diskTemplate returns the empty ext4 image of sizeMB that the disks of the state
// directories beside sandboxDir (in its parent) are copied from, making it with the mke2fs
// at prog on first use. The file is the caller's to close: a descriptor of its own, so that
// evicting the template from the cache never closes it under a copy.
//
// mke2fs costs a start a process and about 4 ms (more on a loaded host); a sparse copy of
// its output (some 600 KiB of data in about ten extents for 1 GiB, shared blocks where the
// file system reflinks) costs a fraction of that. The template is an unnamed file
// (O_TMPFILE) in parent, so that it is on the state root's file system and nothing of it
// outlives this process: no record, no cleanup after a crash. Every disk copied from one
// template has the same file system UUID; each is mounted only in its own sandbox's mount
// namespace (or detached, for a capture), and ext4 does not refuse duplicates.
func (r *Runtime) diskTemplate(ctx context.Context, sandboxDir string, sizeMB int, prog string) (*os.File, error) {
	parent := filepath.Dir(sandboxDir)
	key := diskTemplateKey{parent, sizeMB}
	r.diskMu.Lock()
	defer r.diskMu.Unlock()
	if f, ok := r.diskTemplates[key]; ok {
		return dupFile(f)
	}
	f, err := makeDiskTemplate(ctx, parent, sandboxDir, sizeMB, prog)
	if err != nil {
		return nil, err
	}
	if r.diskTemplates == nil {
		r.diskTemplates = map[diskTemplateKey]*os.File{}
	}
	if len(r.diskOrder) >= maxDiskTemplates {
		// The oldest goes; a copy in progress holds a duplicate of its own.
		oldest := r.diskOrder[0]
		r.diskOrder = r.diskOrder[1:]
		r.diskTemplates[oldest].Close()
		delete(r.diskTemplates, oldest)
	}
	r.diskTemplates[key] = f
	r.diskOrder = append(r.diskOrder, key)
	return dupFile(f)
}

// dupFile returns a descriptor of its own (close-on-exec) for the file f has open.
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// diskTemplateKey names a disk template: the directory of the state directories it serves
// and its size.
type diskTemplateKey struct {
	parent string
	sizeMB int
}

// makeDiskTemplate makes an empty ext4 file system of sizeMB with the mke2fs at prog, in an
// unnamed sparse file in dir, or, where dir's file system has no O_TMPFILE, in a file of
// sandboxDir unlinked as soon as it is open (a crash in between leaves a temporary disk
// image there, which the next start removes).
func makeDiskTemplate(ctx context.Context, dir, sandboxDir string, sizeMB int, prog string) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
		f, err = unlinkedFile(sandboxDir)
	}
	if err != nil {
		return nil, fmt.Errorf("namespace runtime: a file for the disk template: %w", err)
	}
	if err := f.Truncate(int64(sizeMB) << 20); err != nil {
		f.Close()
		return nil, err
	}
	// No reserved blocks (the sandbox's root may use the whole disk), inodes for small files,
	// and the inode tables and journal initialised lazily: a sparse image stays small.
	cmd := exec.CommandContext(ctx, prog, "-q", "-F", "-t", "ext4", "-m", "0", "-i", "8192",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "/proc/self/fd/3")
	cmd.ExtraFiles = []*os.File{f}
	if out, err := cmd.CombinedOutput(); err != nil {
		f.Close()
		return nil, fmt.Errorf("namespace runtime: mke2fs of the disk template: %v: %s", err, bytes.TrimSpace(out))
	}
	return f, nil
}

// unlinkedFile creates a file under a temporary disk image's name in dir and removes the
// name, leaving the file open.
func unlinkedFile(dir string) (*os.File, error) {
	p := filepath.Join(dir, platform.TempName(shim.EntryDiskImage))
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := os.Remove(p); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Start launches the shim for spec, detached, and returns its identity. Its steps run in this
// order, each only once the one before succeeded: the spec's checks, its defaults, the layers'
// checks, the state directory (with the sandbox's disk), the log, the shim's configuration,
// and the spawn.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (platform.ProcessID, error) {
	if r.refusal != nil {
		return platform.ProcessID{}, r.refusal
	}
	if err := checkSpec(spec); err != nil {
		return platform.ProcessID{}, err
	}
	if spec.Restore != nil {
		return platform.ProcessID{}, errors.New("namespace runtime: its generations are files; there is no memory to restore")
	}
	spec = withDefaults(spec)
	if err := ctx.Err(); err != nil {
		return platform.ProcessID{}, err
	}
	if err := checkLayers(spec); err != nil {
		return platform.ProcessID{}, err
	}
	if err := r.prepareStateDir(ctx, spec); err != nil {
		return platform.ProcessID{}, err
	}
	logf, err := openLog(spec.Dir)
	if err != nil {
		return platform.ProcessID{}, err
	}
	defer logf.Close()
	cfg, err := json.Marshal(shim.Config{Spec: spec, Cgroup: r.cgroupName(spec.ID, spec.Dir), Seccomp: r.seccomp, IDs: r.cfg.IDs, ReleaseSocket: r.cfg.ReleaseSocket, Mounts: r.probe.mounts})
	if err != nil {
		return platform.ProcessID{}, err
	}
	return r.spawn(spec.Dir, logf, cfg)
}

// checkSpec validates spec and refuses paths that an overlayfs mount option cannot carry.
func checkSpec(spec runtime.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	for _, p := range append(append([]string{}, spec.Lowers...), spec.ImageDir, spec.Dir, spec.HostBase) {
		if strings.ContainsAny(p, ":,\n") {
			return fmt.Errorf("namespace runtime: path %q has a character overlayfs cannot take", p)
		}
	}
	return nil
}

// withDefaults returns spec with its host name (the id) and zero resources
// ([DefaultResources]) filled in.
func withDefaults(spec runtime.Spec) runtime.Spec {
	if spec.Hostname == "" {
		spec.Hostname = spec.ID
	}
	if spec.Resources.VCPUs == 0 {
		spec.Resources.VCPUs = DefaultResources.VCPUs
	}
	if spec.Resources.MemoryMB == 0 {
		spec.Resources.MemoryMB = DefaultResources.MemoryMB
	}
	if spec.Resources.Pids == 0 {
		spec.Resources.Pids = DefaultResources.Pids
	}
	return spec
}

// checkLayers checks that the state directory and every layer are directories themselves:
// layers are mounted by path, and a link to a directory would mount whatever it points to.
func checkLayers(spec runtime.Spec) error {
	for _, p := range append(append([]string{spec.Dir}, spec.Lowers...), spec.ImageDir) {
		if p == "" {
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			return fmt.Errorf("namespace runtime: %s is not a directory (%v)", p, err)
		}
	}
	return nil
}

// prepareStateDir makes the entries of the state directory that the shim and init expect,
// removes what an earlier run left that would get in the way, and prepares the sandbox's
// own disk if it has one.
func (r *Runtime) prepareStateDir(ctx context.Context, spec runtime.Spec) error {
	type entry struct {
		name string
		perm os.FileMode
	}
	dirs := []entry{{shim.EntryControl, 0o700}, {shim.EntryRootfs, 0o700}}
	if spec.DiskMB == 0 {
		// With a disk of its own, the writable layer is on the disk: the state directory's
		// would be two more inodes made and removed with every sandbox, and never used.
		dirs = append(dirs, entry{shim.EntryUpper, 0o755}, entry{shim.EntryWork, 0o700})
	}
	for _, e := range dirs {
		if err := platform.EnsureDir(spec.Dir, e.name, e.perm); err != nil {
			return err
		}
	}
	// Garbage of earlier versions: a base layer of the sandbox's own, made before the base
	// was shared, and the host files' layer, on a tmpfs of the shim's now.
	garbage := []string{shim.EntryHostFiles}
	if spec.ImageDir == "" && spec.HostBase != "" {
		garbage = append(garbage, shim.EntryBase)
	}
	for _, name := range garbage {
		if err := os.RemoveAll(filepath.Join(spec.Dir, name)); err != nil {
			return err
		}
	}
	if spec.DiskMB > 0 {
		if err := r.prepareDisk(ctx, spec); err != nil {
			return err
		}
	}
	// A socket left by the previous run answers nobody: gone, bothyd waits for the shim's
	// new one rather than dialling a dead one.
	if err := os.Remove(r.ControlPath(spec.Dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// prepareDisk makes the image of the sandbox's own disk (Spec.DiskMB) if it has none yet,
// from the disk template of its size.
func (r *Runtime) prepareDisk(ctx context.Context, spec runtime.Spec) error {
	prog, err := r.diskTool()
	if err != nil {
		return err
	}
	return ensureDiskImage(spec.Dir, spec.DiskMB, func() (*os.File, error) {
		return r.diskTemplate(ctx, spec.Dir, spec.DiskMB, prog)
	})
}

// openLog opens the state directory's sandbox.log for the shim's output, emptied: each start
// replaces the log of the one before.
func openLog(dir string) (*os.File, error) {
	logf, err := os.OpenFile(filepath.Join(dir, shim.EntryLog), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("namespace runtime: open sandbox.log: %w", err)
	}
	if fi, err := logf.Stat(); err != nil || !fi.Mode().IsRegular() {
		logf.Close()
		return nil, fmt.Errorf("namespace runtime: sandbox.log is not a regular file")
	}
	return logf, nil
}

// spawn starts the shim for the state directory dir, detached, with its output to logf, and
// hands it cfg on its fd 3. It returns the shim's identity once the shim has its
// configuration.
func (r *Runtime) spawn(dir string, logf *os.File, cfg []byte) (platform.ProcessID, error) {
	return runtime.SpawnDetached("namespace", r.cfg.Executable, []string{shim.ShimCommand, dir}, logf, cfg, r.cfg.CgroupParent)
}

// Kill kills the sandbox's init (the shim's only child) by verified identity and waits for the
// shim to record the outcome and exit; if the shim lingers past ctx, it is killed too (its
// init then dies with it by its parent-death signal).
//
// The wait is on the shim's pidfd, so it ends as soon as the shim exits rather than at the
// next poll (a poll that backed off to 20 ms cost a forced stop up to that much).
func (r *Runtime) Kill(ctx context.Context, dir string, id platform.ProcessID) error {
	// The init is signalled again each time the wait times out: a shim caught before it
	// started its init would otherwise start one after the first signal went out.
	delay := time.Millisecond
	for id.Alive() {
		// Only the init is signalled, the one child in a pid namespace of its own: the shim's
		// releaser, its child (from its fork on) for the moment before the shim exits, holds
		// the disk's lock until the kernel is done with the image, which its death would not
		// wait for (shim/release_linux.go).
		if _, err := platform.SignalChildrenExcept(id, syscall.SIGKILL, inPidNamespaceOf(id.Pid)); err != nil && !errors.Is(err, platform.ErrProcessGone) {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, delay)
		err := platform.WaitExit(wctx, id)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return r.killShim(id)
		case !errors.Is(err, context.DeadlineExceeded):
			return err
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
	return nil
}

// inPidNamespaceOf returns a test of whether a process is in the pid namespace of the
// process pid (as a shim's releaser is, and its init is not).
func inPidNamespaceOf(pid int) func(int) bool {
	own, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	return func(kid int) bool {
		ns, kerr := os.Readlink("/proc/" + strconv.Itoa(kid) + "/ns/pid")
		return err == nil && kerr == nil && ns == own
	}
}

// killShim kills the shim itself, for a shim that did not exit after its init was killed.
func (r *Runtime) killShim(id platform.ProcessID) error {
	if err := platform.SignalVerified(id, syscall.SIGKILL); err != nil && !errors.Is(err, platform.ErrProcessGone) {
		return err
	}
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := platform.WaitExit(wctx, id); err != nil {
		return fmt.Errorf("namespace runtime: %s still runs after SIGKILL", id)
	}
	return nil
}

// Cleanup removes the sandbox's cgroup (killing anything left in it) and any mount left below
// its state directory, once the shim is gone.
func (r *Runtime) Cleanup(ctx context.Context, sandboxID, dir string, id platform.ProcessID) error {
	if err := runtime.CleanupCheck("namespace", sandboxID, dir, id); err != nil {
		return err
	}
	var errs []error
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	if err != nil {
		errs = append(errs, err)
	} else if err := cg.Remove(ctx); err != nil {
		errs = append(errs, err)
	}
	// The sandbox's mounts live in its own mount namespace and die with it; this only catches
	// what a bug or an operator might have mounted on the host.
	if err := platform.UnmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// openDiskLayer opens the writable layer on a stopped sandbox's own disk, for a capture. The
// disk is mounted read-only as a detached mount (fsopen, fsmount), which no mount namespace
// holds: the returned descriptor alone keeps it (and so the loop device) alive, and once the
// last descriptor below it is closed, both go. Nothing is mounted anywhere.
//
// (A mount in a mount namespace of a thread's own would need the thread to die with its
// namespace; Go never ends the main thread, which a locked goroutine may run on, so the mount
// could outlive the capture.)
//
// The disk's lock (shim.LockDisk) is taken first, shared, and let go once the mount is made:
// the release of the last launch may still be in progress, and two superblocks on one image
// at a time would corrupt it. No launch can start while the capture mounts it, since both
// need the sandbox's lifecycle lock.
func openDiskLayer(dir string) (*os.File, error) {
	img := filepath.Join(dir, shim.EntryDiskImage)
	if _, err := os.Lstat(img); err != nil {
		return nil, err // never started: no disk yet
	}
	lock, err := shim.LockDisk(img, false, nil)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	dev, err := platform.AttachLoop(img)
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	mnt, err := platform.MountDetached("ext4", dev.Name(), unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, err
	}
	defer mnt.Close()
	return platform.OpenDirAt(mnt, shim.EntryUpper)
}
