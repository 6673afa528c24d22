//go:build linux

package microvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/portmux"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// DefaultResources are applied to a Spec's zero resources (Pids does not apply: the guest
// kernel is the sandbox's own).
var DefaultResources = runtime.Resources{VCPUs: 1, MemoryMB: 512}

// DefaultProbeTimeout bounds the KVM probe guest's boot.
const DefaultProbeTimeout = 10 * time.Second

// Config configures the runtime. Its zero value is the default configuration.
type Config struct {
	// Executable is the bothyd binary, re-executed as the shim and copied into the
	// initramfs as the guest's /init; "" means the running executable.
	Executable string
	// QEMU is qemu-system-x86_64; "" looks it up in PATH.
	QEMU string
	// Kernel is the guest kernel image; "" means the newest /boot/vmlinuz-*-cloud-amd64. Its
	// modules are /lib/modules/<release>, the release being the file name's rest.
	Kernel string
	// Accel is the operator's choice of accelerator (bothyd --microvm-accel): "auto" (or
	// "") probes, KVM if the KVM device opens and a probe guest boots under it within
	// ProbeTimeout, TCG otherwise; "kvm" uses KVM without a probe guest, and makes the runtime
	// unavailable where the KVM device does not open; "tcg" never touches KVM.
	Accel        string
	ProbeTimeout time.Duration
	// KVMDevice is the KVM device; "" means /dev/kvm.
	KVMDevice string
	// CgroupParent is the cgroup below which, on cgroup v2, the runtime processes start
	// (runtime.SpawnDetached's <parent>/runtime); "" leaves them in bothyd's. The microVM
	// runtime makes no cgroup of a sandbox's own.
	CgroupParent string
	// VirtioFSD is the virtiofsd that serves volumes to guests (docs/volumes.md); "" looks
	// for QEMU's own (/usr/lib/qemu/virtiofsd, in qemu-system-common) and then in PATH. A
	// host without one runs microVMs without volumes.
	VirtioFSD string
	// StepHook, when set (by tests), is called after each step of Start that leaves something
	// behind (AfterAssets, AfterOverlay), where a test process kills itself to leave what a
	// crash there leaves.
	StepHook func(step string)
}

// The accelerator choices of Config.Accel.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// The steps of Start after which Config.StepHook is called.
const (
	// AfterAssets: the shared initramfs and base disk exist.
	AfterAssets = "microvm-assets"
	// AfterOverlay: the sandbox's disk overlay exists, and no shim was spawned yet.
	AfterOverlay = "microvm-overlay"
)

// Versions are the guest stack's versions, which the runtime identity records.
type Versions struct {
	QEMU      string `json:"qemu"`
	Kernel    string `json:"kernel"`
	Initramfs string `json:"initramfs"`
}

// Runtime is the microvm runtime. Create it with New.
type Runtime struct {
	cfg     Config
	refusal error
	// versions and the initramfs's content are computed once (hashing the executable).
	stack func() (*stack, error)
	probe func() (string, error)
	// assetMu serialises building the shared initramfs and base disks within this process;
	// their rename into place makes concurrent builders of other processes safe.
	assetMu sync.Mutex
}

// stack is the guest stack: versions and the initramfs's files.
type stack struct {
	versions Versions
	files    []cpioFile
	order    []byte
	exeHash  string
}

var (
	_ runtime.Runtime       = (*Runtime)(nil)
	_ runtime.VolumeMounter = (*Runtime)(nil)
	_ runtime.FileLayerer   = (*Runtime)(nil)
)

// New returns the microvm runtime. A host without QEMU or the guest kernel still gets one, so
// that a server there serves its state: its Start and Probe then fail with
// errcode.Unavailable, saying what is missing.
func New(cfg Config) (*Runtime, error) {
	if cfg.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Executable = exe
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	switch cfg.Accel {
	case "":
		cfg.Accel = AccelAuto
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return nil, fmt.Errorf("microvm runtime: accelerator %q is none of auto, kvm, tcg", cfg.Accel)
	}
	if cfg.KVMDevice == "" {
		cfg.KVMDevice = "/dev/kvm"
	}
	var missing []string
	if cfg.QEMU == "" {
		if p, err := exec.LookPath("qemu-system-x86_64"); err == nil {
			cfg.QEMU = p
		} else {
			missing = append(missing, "qemu-system-x86_64 (scripts/setup installs qemu-system-x86)")
		}
	}
	if cfg.Kernel == "" {
		k, _ := filepath.Glob("/boot/vmlinuz-*-cloud-amd64")
		if len(k) == 0 {
			missing = append(missing, errNoKernel.Error())
		} else {
			sort.Strings(k)
			cfg.Kernel = k[len(k)-1]
		}
	}
	if _, err := qemuImg(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := mke2fs(); err != nil {
		missing = append(missing, err.Error())
	}
	if cfg.VirtioFSD == "" {
		cfg.VirtioFSD = findVirtioFSD()
	}
	r := &Runtime{cfg: cfg}
	if len(missing) > 0 {
		r.refusal = errcode.New(errcode.Unavailable, "The microvm runtime cannot run here: missing %s.", strings.Join(missing, "; "))
	}
	r.stack = sync.OnceValues(r.computeStack)
	r.probe = sync.OnceValues(r.runProbe)
	return r, nil
}

// Refusal says why microVMs cannot run here (QEMU, the guest kernel, qemu-img or mke2fs is
// missing), or nil if they can; [Runtime.Probe] then says with which accelerator.
func (r *Runtime) Refusal() error { return r.refusal }

// Kind returns "microvm".
func (r *Runtime) Kind() string { return Kind }

// kernelRelease is the release of the kernel image path (vmlinuz-<release>).
func kernelRelease(path string) string {
	return strings.TrimPrefix(filepath.Base(path), "vmlinuz-")
}

var qemuVersionRE = regexp.MustCompile(`version ([0-9][0-9A-Za-z.+~-]*)`)

func (r *Runtime) computeStack() (*stack, error) {
	if r.refusal != nil {
		return nil, r.refusal
	}
	out, err := exec.Command(r.cfg.QEMU, "--version").Output() //nolint:noctx // a quick look-up
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: %s --version: %w", r.cfg.QEMU, err)
	}
	m := qemuVersionRE.FindSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("microvm runtime: no version in %q", bytes.TrimSpace(out))
	}
	release := kernelRelease(r.cfg.Kernel)
	files, order, err := initramfsFiles(r.cfg.Executable, filepath.Join("/lib/modules", release))
	if err != nil {
		return nil, err
	}
	ih, err := initramfsHash(files, order)
	if err != nil {
		return nil, err
	}
	eh, err := platform.FileSHA256(r.cfg.Executable)
	if err != nil {
		return nil, err
	}
	kh, err := platform.FileSHA256(r.cfg.Kernel)
	if err != nil {
		return nil, err
	}
	return &stack{
		versions: Versions{QEMU: string(m[1]), Kernel: release + "+" + kh[:8], Initramfs: ih},
		files:    files, order: order, exeHash: eh,
	}, nil
}

// Versions returns the guest stack's versions: QEMU's, the kernel's release (with a hash of
// its image) and the initramfs's content hash.
func (r *Runtime) Versions() (Versions, error) {
	st, err := r.stack()
	if err != nil {
		return Versions{}, err
	}
	return st.versions, nil
}

// Identity is "microvm/p<control protocol>/qemu-<version>/kernel-<release>+<hash>/initramfs-<hash>/<hash>",
// the last hash over the executable, the stack and the configuration: a change of QEMU, of
// the kernel or of the initramfs (whose content is the executable and the modules) is a new
// identity, and so a runtime-mismatch for the sandboxes started under the old one.
func (r *Runtime) Identity() string {
	st, err := r.stack()
	if err != nil {
		return fmt.Sprintf("%s/p%d/unknown", Kind, control.ProtocolVersion)
	}
	return identityOf(st.versions, st.exeHash)
}

func identityOf(v Versions, exeHash string) string {
	h := sha256.New()
	cfg, _ := json.Marshal(struct {
		V        Versions
		Exe      string
		Defaults runtime.Resources
	}{v, exeHash, DefaultResources})
	h.Write(cfg)
	return fmt.Sprintf("%s/p%d/qemu-%s/kernel-%s/initramfs-%s/%s", Kind, control.ProtocolVersion,
		v.QEMU, v.Kernel, v.Initramfs, hex.EncodeToString(h.Sum(nil))[:16])
}

// Probe says which accelerator this host's microVMs use, or why microVMs cannot run here at
// all. Under Config.Accel "auto" that is "kvm" when a probe guest boots under KVM within the
// probe timeout and "tcg" otherwise (a QEMU that fails under KVM, as here, answers at once; a
// KVM that stalls the guest costs the whole timeout); "kvm" and "tcg" are answered without a
// probe guest (an operator who knows the host saves the probe's boot). The probe runs once
// per Runtime; the answer is kept, and every Start uses it.
func (r *Runtime) Probe() (string, error) { return r.probe() }

// AccelMode is the operator's choice the probe follows: "auto", "kvm" or "tcg".
func (r *Runtime) AccelMode() string { return r.cfg.Accel }

func (r *Runtime) runProbe() (string, error) {
	if r.refusal != nil {
		return "", r.refusal
	}
	if _, err := r.stack(); err != nil {
		return "", err
	}
	if r.cfg.Accel == AccelTCG {
		return AccelTCG, nil
	}
	// QEMU opens the device read-write (KVM_CREATE_VM needs it); so does this look.
	f, err := os.OpenFile(r.cfg.KVMDevice, os.O_RDWR, 0)
	if err != nil {
		if r.cfg.Accel == AccelKVM {
			return "", errcode.Wrap(errcode.Unavailable, err,
				"The microvm runtime is configured for KVM (--microvm-accel kvm), and %s does not open: %v.", r.cfg.KVMDevice, err)
		}
		return AccelTCG, nil
	}
	f.Close()
	if r.cfg.Accel == AccelKVM {
		return AccelKVM, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ProbeTimeout)
	defer cancel()
	if err := r.bootProbe(ctx, AccelKVM); err != nil {
		return AccelTCG, nil //nolint:nilerr // KVM that does not boot a guest is no KVM: TCG is the answer
	}
	return AccelKVM, nil
}

// bootProbe boots a guest without disk under accel and waits until its init answers on the
// port, or ctx ends.
func (r *Runtime) bootProbe(ctx context.Context, accel string) error {
	// QEMU's parent-death signal fires when the thread that forked it ends, not bothyd: a
	// goroutine that exits locked to a thread ends that thread (platform.WithMountsAttached
	// does), and the probe's QEMU forked from it would die mid-boot, which reads as a KVM
	// that does not boot. Held until QEMU has been waited for (the deferred kill below).
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	st, err := r.stack()
	if err != nil {
		return err
	}
	// The probe's initramfs lives in memory, handed to QEMU as a descriptor: a file on disk
	// would be left behind by a server killed mid-probe (it runs at every start-up).
	initrd, err := memInitramfs(st.files, st.order)
	if err != nil {
		return err
	}
	defer initrd.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "port"), os.NewFile(uintptr(fds[1]), "qemu port")
	defer mine.Close()
	// ExtraFiles[0] is QEMU's fd 3 (the port), ExtraFiles[1] its fd 4 (the initramfs).
	cfg := &shim.Config{Spec: runtime.Spec{Resources: runtime.Resources{VCPUs: 1, MemoryMB: 256}},
		QEMU: r.cfg.QEMU, Accel: accel, Kernel: r.cfg.Kernel, Initramfs: "/proc/self/fd/4", TSCkHz: hostTSCkHz()}
	cmd := exec.CommandContext(ctx, r.cfg.QEMU, shim.QEMUArgs(cfg, true)...)
	cmd.ExtraFiles = []*os.File{theirs, initrd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		theirs.Close()
		return err
	}
	theirs.Close()
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	stop := context.AfterFunc(ctx, func() { mine.Close() })
	defer stop()
	w := portmux.NewWriter(mine)
	buf := make([]byte, portmux.MaxPayload)
	for {
		typ, _, _, err := portmux.ReadFrame(mine, buf)
		if err != nil {
			return fmt.Errorf("the probe guest under %s did not answer: %w", accel, err)
		}
		switch typ {
		case portmux.FrameReady:
			if err := w.WriteFrame(portmux.FrameConfig, 0, []byte(`{"probe":true}`)); err != nil {
				return err
			}
		case portmux.FrameListening:
			return nil
		}
	}
}

// DeclaredEntries lists the names the runtime keeps in a state directory.
func (r *Runtime) DeclaredEntries() []runtime.Entry {
	return []runtime.Entry{
		{Name: shim.EntryControl, Dir: true},
		{Name: shim.EntryLog},
		{Name: shim.EntryOverlay},
		{Name: shim.EntryAssets, Dir: true},
		{Name: shim.EntryMemory, Dir: true},
		{Name: runtime.ForkStateName, Dir: true},
	}
}

// ControlPath returns the host path of the control socket of the sandbox in dir. The shim
// makes it in a directory that the guest has no way to reach, and listens and accepts on it
// itself, so the peer credentials of a connection are the shim's.
func (r *Runtime) ControlPath(dir string) string {
	return filepath.Join(dir, shim.EntryControl, shim.SocketName)
}

// OpenLayer is not implemented: a microVM's own files are a qcow2 overlay, not a directory
// tree, and a microVM is captured running, with its memory ([Runtime.OpenLiveLayer]).
func (r *Runtime) OpenLayer(dir string, disk bool) (*os.File, error) {
	return nil, errcode.New(errcode.NotImplemented, "A microVM sandbox is captured while it runs, memory and all; start it (and resume it if paused) before capturing it.")
}

// Start prepares the guest stack (the initramfs and the image's base disk, shared by the
// sandboxes of Spec.HostBase, built once) and the sandbox's own disk overlay, and launches the
// shim, detached, which starts QEMU. It returns the shim's identity at once.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (platform.ProcessID, error) {
	if r.refusal != nil {
		return platform.ProcessID{}, r.refusal
	}
	if err := spec.Validate(); err != nil {
		return platform.ProcessID{}, err
	}
	chain := splitChain(&spec)
	if spec.Restore != nil && len(chain) > 0 && isMemoryGeneration(chain[0]) {
		// A rollback to a checkpoint that holds the VM's memory (a memory checkpoint): its
		// layer is restored as a generation is, the layer's disk (named as a generation's
		// frozen disk is) the new overlay's backing; the layers below are that disk's.
		spec.Lowers = append([]string{chain[0]}, spec.Lowers...)
		chain = nil
	}
	gen, err := splitGeneration(&spec)
	if err != nil {
		return platform.ProcessID{}, err
	}
	if gen != "" && len(chain) > 0 {
		return platform.ProcessID{}, errcode.New(errcode.CheckpointUnsupported,
			"A microVM cloned from a template has no checkpoints: its disk backs onto its generation's, which its checkpoints would have to name without a lease. Delete the sandbox's checkpoints.")
	}
	spec = withDefaults(spec)
	accel, err := r.Probe()
	if err != nil {
		return platform.ProcessID{}, err
	}
	assets := spec.HostBase
	if assets == "" {
		assets = filepath.Join(spec.Dir, shim.EntryAssets)
	}
	launch := shim.StateInfo{Format: shim.StateFormat, Accel: accel, VCPUs: spec.Resources.VCPUs, MemoryMB: spec.Resources.MemoryMB, NIC: spec.Network,
		Volumes: len(spec.Volumes)}
	virtiofsd := ""
	if len(spec.Volumes) > 0 {
		if err := r.VolumeSupport(); err != nil {
			return platform.ProcessID{}, err
		}
		if spec.Restore != nil {
			return platform.ProcessID{}, ErrVolumesNoRestore
		}
		virtiofsd = r.cfg.VirtioFSD
	}
	initrd, overlay, restore, err := r.makeDisk(ctx, assets, spec, gen, chain, &launch)
	if err != nil {
		return platform.ProcessID{}, err
	}
	r.step(AfterOverlay)
	if err := platform.EnsureDir(spec.Dir, shim.EntryControl, 0o700); err != nil {
		return platform.ProcessID{}, err
	}
	// Sockets left by the previous run answer nobody: gone, bothyd waits for the shim's
	// new one rather than dialling a dead one.
	for _, p := range []string{r.ControlPath(spec.Dir), qmpPath(spec.Dir)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return platform.ProcessID{}, err
		}
	}
	info, err := record.Encode(&launch)
	if err != nil {
		return platform.ProcessID{}, err
	}
	if err := platform.WriteFileDurable(filepath.Join(spec.Dir, shim.EntryControl), launchInfoName, info, 0o600); err != nil {
		return platform.ProcessID{}, err
	}
	logf, err := openLog(spec.Dir)
	if err != nil {
		return platform.ProcessID{}, err
	}
	defer logf.Close()
	cfg, err := json.Marshal(shim.Config{Spec: spec, QEMU: r.cfg.QEMU, Accel: accel, Kernel: r.cfg.Kernel, Initramfs: initrd, Overlay: overlay,
		TSCkHz: hostTSCkHz(), QMP: qmpPath(spec.Dir), Port: launch.Port, Restore: restore, NIC: launch.NIC, VirtioFSD: virtiofsd})
	if err != nil {
		return platform.ProcessID{}, err
	}
	return r.spawn(spec.Dir, logf, cfg)
}

// makeDisk makes (unless they are there) the initramfs, the base disk in assets and the
// sandbox's overlay over it, or over the memory generation gen, and returns the initramfs,
// the overlay and a clone's restore; it sets launch's port and NIC for a generation's. It
// holds the assets lock shared throughout, so that bothyd check --repair, which removes a
// base disk no disk backs onto under that lock taken exclusively, never removes the one this
// start is about to make its overlay over.
func (r *Runtime) makeDisk(ctx context.Context, assets string, spec runtime.Spec, gen string, chain []string, launch *shim.StateInfo) (initrd, overlay string, restore *shim.Restore, err error) {
	l, err := lockAssets(assets, true)
	if err != nil {
		return "", "", nil, err
	}
	defer l.Close()
	// A sandbox that ran before has its disk: its overlay names the base disk it was made
	// over, which stays its base (the image or the host may have changed since).
	// A clone's base is its generation's frozen disk.
	// A sandbox back at a checkpoint (its disk moved into a layer, or thrown away by a
	// rollback) gets a new overlay over the top of its chain that holds a disk.
	top := chainTop(chain)
	needBase := gen == "" && top == ""
	if b, err := qcow2Backing(filepath.Join(spec.Dir, shim.EntryOverlay)); err == nil && b != "" {
		needBase = false
	}
	initrd, base, err := r.ensureAssets(assets, spec, needBase)
	if err != nil {
		return "", "", nil, err
	}
	r.step(AfterAssets)
	if err := ctx.Err(); err != nil {
		return "", "", nil, err
	}
	backing, backingFormat := base, "raw"
	if top != "" {
		backing, backingFormat = top, "qcow2"
	}
	if gen != "" {
		if backing, restore, err = overGeneration(spec, gen, launch); err != nil {
			return "", "", nil, err
		}
		backingFormat = "qcow2"
	}
	launch.Format = shim.StateInfoFormat(launch.NIC)
	// A start that crashed while it made the overlay left its temp file; the caller holds the
	// sandbox's lifecycle lock, so no other start makes one now.
	removeTemps(spec.Dir, shim.EntryOverlay)
	overlay, err = ensureOverlay(ctx, spec.Dir, backing, backingFormat, roomMB(spec))
	if err != nil {
		return "", "", nil, err
	}
	return initrd, overlay, restore, nil
}

// step calls the tests' step hook, if any.
func (r *Runtime) step(name string) {
	if r.cfg.StepHook != nil {
		r.cfg.StepHook(name)
	}
}

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
	return spec
}

// ensureAssets makes the initramfs and (with needBase) the base disk of the spec's image (the
// host's, or an OCI image's layers) in dir unless they are there, and returns their paths.
func (r *Runtime) ensureAssets(dir string, spec runtime.Spec, needBase bool) (initrd, base string, err error) {
	st, err := r.stack()
	if err != nil {
		return "", "", err
	}
	r.assetMu.Lock()
	defer r.assetMu.Unlock()
	initrd, err = ensureFile(dir, initramfsName(st.versions.Initramfs), func(tmp string) error {
		return writeInitramfs(tmp, st.files, st.order)
	})
	if err != nil {
		return "", "", fmt.Errorf("microvm runtime: the initramfs: %w", err)
	}
	if !needBase {
		return initrd, "", nil
	}
	mkfs, err := mke2fs()
	if err != nil {
		return "", "", err
	}
	if spec.ImageDir == "" {
		base, err = ensureFile(dir, hostBaseName(), func(tmp string) error { return writeHostBase(tmp, mkfs) })
		if err != nil {
			return "", "", fmt.Errorf("microvm runtime: the host base disk: %w", err)
		}
		return initrd, base, nil
	}
	layers := imageLayers(spec)
	name, err := imageBaseName(layers, spec.Dir)
	if err != nil {
		return "", "", err
	}
	base, err = ensureFile(dir, name, func(tmp string) error { return writeImageBase(tmp, mkfs, layers, spec.Dir) })
	if err != nil {
		return "", "", fmt.Errorf("microvm runtime: the base disk of image %s: %w", spec.Image, err)
	}
	return initrd, base, nil
}

// splitChain takes the sandbox's checkpoint chain off the top of spec's lower layers (the
// directories below its state directory's checkpoints/layers, [runtime.FileLayerer]) and
// returns it, top first. They are known by where they lie, never by what they hold: an
// image's layer may hold any file.
func splitChain(spec *runtime.Spec) []string {
	layers := checkpoint.LayersDir(spec.Dir)
	n := 0
	for n < len(spec.Lowers) && filepath.Dir(spec.Lowers[n]) == layers {
		n++
	}
	chain := spec.Lowers[:n:n]
	spec.Lowers = spec.Lowers[n:]
	return chain
}

// chainTop is the disk of the first layer of chain that holds one ("" for none: every layer
// is of a sandbox that had not run yet). The disk's own header names what it backs onto.
func chainTop(chain []string) string {
	for _, l := range chain {
		p := filepath.Join(l, shim.EntryOverlay)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// LayerFile implements runtime.FileLayerer: a microVM's files are its disk overlay.
func (r *Runtime) LayerFile() string { return shim.EntryOverlay }

// splitGeneration takes a memory generation off the top of spec's lower layers, where a
// clone of one has it, and returns its directory ("" for none); the layers below are the
// image's. Layers of files are refused.
func splitGeneration(spec *runtime.Spec) (string, error) {
	gen := ""
	if len(spec.Lowers) > 0 && isMemoryGeneration(spec.Lowers[0]) {
		gen = spec.Lowers[0]
		spec.Lowers = spec.Lowers[1:]
	}
	if spec.ImageDir == "" && len(spec.Lowers) > 0 {
		return "", errcode.New(errcode.NotImplemented,
			"The microvm runtime does not run template layers of files: a microVM's files are its disk overlay, and its generations hold its memory.")
	}
	if gen == "" && spec.Restore != nil {
		return "", errors.New("microvm runtime: a restore names no memory generation")
	}
	return gen, nil
}

// overGeneration is a launch over the memory generation gen: the disk its overlay backs onto
// (the frozen one) and, for a restore, the restore, with launch's port set to the one idle at
// the save and its NIC the saved one's (a restore loads into exactly the saved devices, so a
// generation with a NIC gives its clone one whatever its policy, and one without gives none:
// a networked launch of it is refused, there being no hot-plug). A restore's overlay is made
// anew: the memory is the frozen disk's.
func overGeneration(spec runtime.Spec, gen string, launch *shim.StateInfo) (string, *shim.Restore, error) {
	saved, err := savedState(gen, launch)
	if err != nil {
		return "", nil, err
	}
	if spec.Restore == nil {
		return filepath.Join(gen, shim.StateDisk), nil, nil
	}
	if spec.Network && !saved.NIC {
		return "", nil, ErrNoSavedNIC
	}
	if err := os.Remove(filepath.Join(spec.Dir, shim.EntryOverlay)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", nil, err
	}
	launch.Port, launch.NIC = 1-saved.Port, saved.NIC
	return filepath.Join(gen, shim.StateDisk), &shim.Restore{Memory: filepath.Join(gen, shim.StateMemory), ClockAdvanceNS: int64(spec.Restore.ClockAdvance)}, nil
}

// ErrNoSavedNIC refuses a networked restore of a memory generation saved without a NIC.
var ErrNoSavedNIC = errcode.New(errcode.Unavailable,
	"The memory generation was captured from a microVM without a network interface, and a restore has exactly the captured devices (no hot-plug); clone it without a network, or capture a generation of a microVM started with one.")

// isMemoryGeneration reports whether the layer dir is a microVM's memory generation: it has
// the state's description.
func isMemoryGeneration(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, shim.StateMeta))
	return err == nil
}

// savedState reads the memory generation in gen and checks that a launch as described by
// launch can run over it: a saved VM restores only into one of its accelerator, vCPUs and
// memory, and its disk is the base of a clone's cold boots too.
func savedState(gen string, launch *shim.StateInfo) (*shim.StateInfo, error) {
	saved, err := readStateInfo(gen, shim.StateMeta)
	if err != nil {
		return nil, err
	}
	if saved.Accel != launch.Accel || saved.VCPUs != launch.VCPUs || saved.MemoryMB != launch.MemoryMB {
		return nil, errcode.New(errcode.TemplateIneligible, "The memory state was saved from a VM of %d vCPUs and %d MiB under %s; this launch is of %d vCPUs and %d MiB under %s.",
			saved.VCPUs, saved.MemoryMB, saved.Accel, launch.VCPUs, launch.MemoryMB, launch.Accel)
	}
	return saved, nil
}

// DefaultRoomMB is the room for a sandbox's own files when its spec names no disk size.
const DefaultRoomMB = 1024

// roomMB is the room for the sandbox's own files on its disk, beyond the image's.
func roomMB(spec runtime.Spec) int {
	if spec.DiskMB > 0 {
		return spec.DiskMB
	}
	return DefaultRoomMB
}

// ensureOverlay makes the sandbox's own disk, a qcow2 overlay over base unless it has one:
// the sandbox's files persist across its runs as the namespace runtime's upper layer does.
// Over an image's raw base disk (baseFormat "raw") it has room MiB beyond it: the guest's init
// grows the file system into the room at boot, and the overlay file grows as the guest
// writes, up to the disk's size (Spec.DiskMB bounds it). Over a memory generation's frozen
// overlay ("qcow2") it has that disk's size, which the file system in the saved memory knows.
func ensureOverlay(ctx context.Context, dir, base, baseFormat string, room int) (string, error) {
	img, err := qemuImg()
	if err != nil {
		return "", err
	}
	return ensureFile(dir, shim.EntryOverlay, func(tmp string) error {
		args := []string{"create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", base, tmp}
		if baseFormat == "raw" {
			fi, err := os.Stat(base)
			if err != nil {
				return err
			}
			args = append(args, strconv.FormatInt(fi.Size()+int64(room)<<20, 10))
		}
		out, err := exec.CommandContext(ctx, img, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("microvm runtime: qemu-img create: %v: %s", err, bytes.TrimSpace(out))
		}
		return syncFile(tmp)
	})
}

// VolumeSupport implements runtime.VolumeMounter: a microVM mounts volumes through
// virtio-fs, served on the host by virtiofsd (docs/volumes.md), which this host must have.
func (r *Runtime) VolumeSupport() error {
	if r.refusal != nil {
		return r.refusal
	}
	if r.cfg.VirtioFSD == "" {
		return errcode.New(errcode.Unavailable,
			"The microvm runtime mounts volumes through virtio-fs, and this host has no virtiofsd (QEMU's is /usr/lib/qemu/virtiofsd in qemu-system-common).")
	}
	return nil
}

// findVirtioFSD is QEMU's virtiofsd, or one in PATH, or "".
func findVirtioFSD() string {
	for _, p := range []string{"/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		return p
	}
	return ""
}

// ErrVolumesNoRestore refuses a restore of a memory state into a launch with volumes.
var ErrVolumesNoRestore = errcode.New(errcode.NotImplemented,
	"A microVM that mounts volumes cannot be restored from a memory state: its volumes are virtio-fs devices, which QEMU cannot save or restore. Create it without volumes, or from a template without memory.")

// ErrVolumesNoMemorySave refuses to save the memory of a microVM with volumes.
var ErrVolumesNoMemorySave = errcode.New(errcode.NotImplemented,
	"The memory of a microVM that mounts volumes cannot be saved: its volumes are virtio-fs devices (vhost-user), which QEMU cannot migrate. Pause it without releasing its memory, or capture a sandbox without volumes.")

// DiskSupport implements runtime.DiskLimiter: a microVM's disk is its overlay, sized by
// Spec.DiskMB wherever microVMs run.
func (r *Runtime) DiskSupport() error { return r.refusal }

func qemuImg() (string, error) {
	if p, err := exec.LookPath("qemu-img"); err == nil {
		return p, nil
	}
	return "", errors.New("qemu-img (scripts/setup installs qemu-utils)")
}

func mke2fs() (string, error) {
	if p, err := exec.LookPath("mke2fs"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mke2fs", "/sbin/mke2fs"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("mke2fs (e2fsprogs)")
}

// openLog opens the state directory's sandbox.log, emptied: each start replaces the log of
// the one before.
func openLog(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, shim.EntryLog), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: open sandbox.log: %w", err)
	}
	return f, nil
}

// spawn starts the shim for dir, detached, with its output to logf and cfg on its fd 3.
func (r *Runtime) spawn(dir string, logf *os.File, cfg []byte) (platform.ProcessID, error) {
	return runtime.SpawnDetached("microvm", r.cfg.Executable, []string{shim.ShimCommand, dir}, logf, cfg, r.cfg.CgroupParent)
}

// Kill kills the sandbox's QEMU (the shim's only child) by verified identity and waits for
// the shim to record the outcome and exit (a shim without QEMU, whose memory is released,
// gets a TERM, which ends its launch); a shim that lingers past ctx is killed too (QEMU then
// dies with it by its parent-death signal).
func (r *Runtime) Kill(ctx context.Context, dir string, id platform.ProcessID) error {
	delay := time.Millisecond
	for id.Alive() {
		n, err := platform.SignalChildren(id, syscall.SIGKILL)
		if err != nil && !errors.Is(err, platform.ErrProcessGone) {
			return err
		}
		if n == 0 {
			// No QEMU: its memory is released (or it is about to start). A TERM ends a
			// released launch, which the shim records.
			if err := platform.SignalVerified(id, syscall.SIGTERM); err != nil && !errors.Is(err, platform.ErrProcessGone) {
				return err
			}
		}
		select {
		case <-ctx.Done():
			if err := platform.SignalVerified(id, syscall.SIGKILL); err != nil && !errors.Is(err, platform.ErrProcessGone) {
				return err
			}
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return platform.WaitExit(wctx, id)
		case <-time.After(delay):
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
	return nil
}

// Cleanup releases what a launch may have left once its shim is gone: a QEMU of the sandbox
// that outlived it (its parent-death signal makes that a bug's doing, not the rule) and the
// control socket. The sandbox's disk overlay is its files and stays.
func (r *Runtime) Cleanup(ctx context.Context, sandboxID, dir string, id platform.ProcessID) error {
	if err := runtime.CleanupCheck("microvm", sandboxID, dir, id); err != nil {
		return err
	}
	var errs []error
	for _, q := range strayQEMUs(r.cfg.QEMU, filepath.Join(dir, shim.EntryOverlay)) {
		if err := platform.SignalVerified(q, syscall.SIGKILL); err != nil && !errors.Is(err, platform.ErrProcessGone) {
			errs = append(errs, err)
			continue
		}
		if err := platform.WaitExit(ctx, q); err != nil {
			errs = append(errs, err)
		}
	}
	stale := []string{r.ControlPath(dir), qmpPath(dir), filepath.Join(dir, shim.EntryControl, shim.ShimSocketName)}
	// A volume's rendezvous socket lives only while its virtiofsd starts: one left is a crash's.
	vfs, _ := filepath.Glob(filepath.Join(dir, shim.EntryControl, "vfs*.sock"))
	for _, p := range append(stale, vfs...) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// Released memory is its launch's: the launch is over.
	if err := os.RemoveAll(filepath.Join(dir, shim.EntryMemory)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// hostTSCkHz is the host CPU's frequency in kHz as /proc/cpuinfo gives it (the TSC's on
// CPUs with an invariant TSC), or 0 if it gives none.
func hostTSCkHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 0 {
				return int(mhz * 1000)
			}
		}
	}
	return 0
}
