// Package runtime defines the interface between the supervisor and a sandbox runtime: the
// component that turns a state directory and a Spec into a running sandbox whose agent
// answers on a control socket, and that reports how the sandbox ended.
//
// A runtime knows nothing of records, journals or locks: the supervisor calls it under the
// sandbox's lifecycle lock and keeps the records. The runtime starts one detached process per
// launch (the runtime process, whose identity the supervisor records), which outlives
// bothyd, waits for the sandbox, writes the outcome report and cleans up after itself; Kill
// and Cleanup exist for when it cannot (it was killed, or the host crashed).
package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
)

// Resources are a sandbox's limits. Zero means the runtime's default.
type Resources struct {
	VCPUs    int `json:"vcpus"`
	MemoryMB int `json:"memory_mb"`
	Pids     int `json:"pids"`
}

// Spec says what to launch.
type Spec struct {
	// ID is the sandbox id (validated by the store: 1-63 of a-z 0-9 -). It is the hostname
	// and names the sandbox's cgroup.
	ID string `json:"id"`
	// Dir is the sandbox's state directory, absolute.
	Dir string `json:"dir"`
	// LaunchID names this launch; the outcome report carries it so that a report of an older
	// launch is never taken for this one's.
	LaunchID string `json:"launch_id"`
	// Image is the image name ("host" for the built-in one); ImageDir is its directory
	// (absolute), or "" for the built-in host image.
	Image    string `json:"image"`
	ImageDir string `json:"image_dir,omitempty"`
	// HostBase is a directory, absolute, where the runtime may keep what the host image
	// needs beyond the host's own files, shared by every sandbox that names it (the
	// supervisor gives one per state root); "" keeps it in the sandbox's state directory.
	HostBase string `json:"host_base,omitempty"`
	// Lowers are read-only layers above the image (template generation layers), top first.
	Lowers    []string  `json:"lowers,omitempty"`
	Resources Resources `json:"resources"`
	// DiskMB, when not zero, gives the sandbox a disk of its own of that many MiB for its
	// writable layer (see DiskLimiter).
	DiskMB int `json:"disk_mb,omitempty"`
	// Env is the default environment of the sandbox's workloads.
	Env map[string]string `json:"env,omitempty"`
	// Capability is the launch's secret that the agent requires on every control
	// connection. It travels on pipes only, never in a file inside the sandbox.
	Capability []byte `json:"capability"`
	// Hostname defaults to ID.
	Hostname string `json:"hostname,omitempty"`
	// Network says that the sandbox's policy gives it a network interface at this launch
	// (the supervisor sets it up once the agent answers). A runtime whose interface must
	// exist from the start, a VM's NIC, makes it only then; the namespace runtime gives every
	// sandbox a network namespace of its own either way. A restore of a memory generation
	// has the generation's interface, whatever this says ([SavedNICer]): a runtime refuses
	// Network for a generation saved without one.
	Network bool `json:"network,omitempty"`
	// Volumes are file systems to mount into the sandbox (package volume), each already
	// mounted on the host at Source; the runtime mounts a clone of it at Target inside,
	// read-only if ReadOnly. Only a [VolumeMounter] takes them.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Restore, when set, restores the memory state of the generation in Lowers rather than
	// booting (a [MemoryCapturer]'s generation): the processes that ran at the capture run
	// on, on a disk of the sandbox's own over the generation's, made anew. The supervisor
	// sets it only for a generation that is eligible by its time contract.
	Restore *Restore `json:"restore,omitempty"`
}

// VolumeMount is a volume mounted into a sandbox: the host mount at Source (a clean absolute
// path) at Target inside (a clean absolute path, validated by package volume).
type VolumeMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeMounter is a Runtime that mounts volumes (Spec.Volumes).
type VolumeMounter interface {
	// VolumeSupport says why this host cannot, or nil if it can.
	VolumeSupport() error
}

// ForkStateName is the directory, in a state directory, of the memory state a fork of a
// running sandbox of a memory-capturing runtime ([MemoryCapturer]) restores: the state as a
// capture's generation holds it (its memory, its description, its frozen disk), the fork's
// own copy, which its disk then backs onto for as long as the fork lives. The supervisor
// passes it as the top lower layer, where a clone has its generation's.
const ForkStateName = "fork-state"

// Restore is a launch that restores a saved memory state.
type Restore struct {
	// ClockAdvance is the state's downtime by the generation's time contract: the guest's
	// clock, stopped at the capture, is advanced by it.
	ClockAdvance time.Duration `json:"clock_advance"`
}

// Validate checks the parts of a spec that every runtime relies on.
func (s *Spec) Validate() error {
	if err := validateID(s.ID); err != nil {
		return err
	}
	if err := s.validatePaths(); err != nil {
		return err
	}
	if len(s.Capability) == 0 {
		return fmt.Errorf("runtime: the launch has no capability")
	}
	if s.LaunchID == "" {
		return fmt.Errorf("runtime: the launch has no id")
	}
	if s.Resources.VCPUs < 0 || s.Resources.MemoryMB < 0 || s.Resources.Pids < 0 || s.DiskMB < 0 {
		return fmt.Errorf("runtime: negative resources %+v", s.Resources)
	}
	return nil
}

// validateID checks the sandbox id against the id rule the store checked it with
// ([naming.CheckID]): it becomes a hostname and a cgroup's name.
func validateID(id string) error {
	var e *naming.IDError
	if !errors.As(naming.CheckID(id), &e) {
		return nil
	}
	if e.Fault == naming.Empty || e.Fault == naming.TooLong {
		return fmt.Errorf("runtime: sandbox id %q must be 1-%d characters", id, naming.MaxIDLen)
	}
	return fmt.Errorf("runtime: sandbox id %q must be a-z 0-9 - starting with a letter or digit", id)
}

// validatePaths checks that every directory of the spec is a clean absolute path, so that it
// names the same directory to the runtime process, whatever its working directory, as to the
// supervisor that wrote it.
func (s *Spec) validatePaths() error {
	if !naming.IsCleanAbs(s.Dir) {
		return fmt.Errorf("runtime: state directory %q must be a clean absolute path", s.Dir)
	}
	if s.ImageDir != "" && !naming.IsCleanAbs(s.ImageDir) {
		return fmt.Errorf("runtime: image directory %q must be a clean absolute path", s.ImageDir)
	}
	if s.HostBase != "" && !naming.IsCleanAbs(s.HostBase) {
		return fmt.Errorf("runtime: host base directory %q must be a clean absolute path", s.HostBase)
	}
	for _, l := range s.Lowers {
		if !naming.IsCleanAbs(l) {
			return fmt.Errorf("runtime: layer %q must be a clean absolute path", l)
		}
	}
	for _, v := range s.Volumes {
		if !naming.IsCleanAbs(v.Source) || !naming.IsCleanAbs(v.Target) || v.Target == "/" {
			return fmt.Errorf("runtime: volume %q at %q must be clean absolute paths", v.Source, v.Target)
		}
	}
	return nil
}

// DiskLimiter is a Runtime that can give a sandbox a disk of its own (Spec.DiskMB).
type DiskLimiter interface {
	// DiskSupport says why this host cannot, or nil if it can.
	DiskSupport() error
}

// FileLayerer is a Runtime whose sandbox's writable layer is one file in its state directory
// (the microVM runtime's disk overlay, whose header names the disk it backs onto), not an
// overlay's upper directory. Checkpoints (package checkpoint) move or copy that file into a
// layer directory under the same name; a launch then gets the sandbox's checkpoint chain as
// the first of Spec.Lowers (top first, each a directory below the state directory's
// checkpoints/layers holding the file, or empty for a sandbox that had not run), and makes
// the sandbox a new file over the first layer that holds one when it has none.
type FileLayerer interface {
	// LayerFile is the file's name in the state directory.
	LayerFile() string
}

// Entry is a name a runtime keeps in a state directory, for store.Declare.
type Entry struct {
	Name string
	Dir  bool
}

// Runtime starts and ends sandboxes of one kind. Methods are safe for concurrent use on
// different state directories; the supervisor serialises calls on one directory with the
// lifecycle lock.
type Runtime interface {
	// Kind names the runtime ("namespace").
	Kind() string
	// Identity is the runtime kind, the control protocol version, and a hash of the bothyd
	// executable and the runtime's configuration: a process started under another identity is
	// never driven (runtime-mismatch).
	Identity() string
	// DeclaredEntries are the names the runtime keeps in a state directory.
	DeclaredEntries() []Entry
	// Start launches the runtime process for spec, detached (own session, survives bothyd's
	// exit, stdout and stderr to <dir>/sandbox.log, replaced at each start), and returns its
	// identity at once: readiness is the agent answering on ControlPath, which the caller
	// waits for.
	Start(ctx context.Context, spec Spec) (platform.ProcessID, error)
	// ControlPath is the host path of the control socket of the sandbox in dir. Nothing inside
	// the sandbox may reach that path, and the socket's listener must be the runtime process
	// itself (the one Start returns): the supervisor dials it without following links and
	// sends the capability only to a peer whose credentials (SO_PEERCRED) name that process.
	ControlPath(dir string) string
	// OpenLayer opens the sandbox's own writable layer (an overlayfs upper directory:
	// whiteouts as 0/0 character devices, opaque directories as xattrs), which a capture
	// copies into a template generation while the sandbox is stopped; disk says the sandbox
	// has a disk of its own (Spec.DiskMB). The directory may lie on a mount that only the
	// returned descriptor reaches: read below it through the descriptor. A sandbox that never
	// ran has no layer (an error wrapping fs.ErrNotExist). The caller closes the file.
	OpenLayer(dir string, disk bool) (*os.File, error)
	// Kill forcibly ends the sandbox whose runtime process is id: it kills the sandbox's init
	// by verified identity, so that the runtime process records the outcome and exits, and
	// waits until the runtime process is gone (killing it too if it lingers past ctx). A
	// runtime process that is already gone is not an error.
	Kill(ctx context.Context, dir string, id platform.ProcessID) error
	// Cleanup releases what a launch may have left behind once its runtime process is gone
	// (its cgroup, with any process still in it; mounts), so that nothing leaks even after a
	// crash of the runtime process. It refuses while id is alive. Idempotent.
	Cleanup(ctx context.Context, sandboxID, dir string, id platform.ProcessID) error
	// Processes lists the live runtime processes (and sandbox inits) of the state root, for the
	// consistency checker. It identifies them by facts that no process inside a sandbox can
	// forge, not by a marker in argv alone, which any process can give itself.
	Processes(stateRoot string) ([]Process, error)
	// HostResources lists what the runtime holds on the host, outside state directories (the
	// cgroups), and the files in state directories that only a running launch needs (a
	// microVM's control socket), for the sandboxes whose state directories are
	// <sandboxesDir>/<id>, whether they run or not and whether the directory still exists or
	// not, for the consistency checker: Cleanup releases those of a sandbox that is not
	// running. An error means the runtime could not look.
	HostResources(sandboxesDir string) ([]HostResource, error)
}

// HostResource is something a runtime holds on the host for one sandbox, outside its state
// directory, found by HostResources.
type HostResource struct {
	Kind ResourceKind
	// SandboxID and Dir name the sandbox it belongs to (Dir is its state directory).
	SandboxID string
	Dir       string
	// Name is what an operator knows it by (a cgroup's path below the hierarchy's root,
	// "bothy/demo.1a2b3c4d").
	Name string
	// Paths are where it lies on the host (a cgroup's directory, on cgroup v1 one in each
	// hierarchy): it exists while any of them does.
	Paths []string
}

// ResourceKind is what a HostResource is.
type ResourceKind string

// The kinds of host resources.
const (
	// ResourceCgroup is a sandbox's cgroup.
	ResourceCgroup ResourceKind = "cgroup"
	// ResourceFile is a file in a sandbox's state directory that only a running launch
	// needs (a microVM's control socket, which nobody answers once its shim is gone).
	ResourceFile ResourceKind = "file"
)

// SharedFiles is implemented by a runtime that keeps files shared by its sandboxes in the
// host base directory (Spec.HostBase), for the consistency checker.
type SharedFiles interface {
	// StaleShared lists the entries of hostBase that this runtime made and that nothing
	// needs any more, the sandboxes being those whose state directories are
	// <sandboxesDir>/<id>: what a build that crashed left half made, and what an older guest
	// stack left that no sandbox or live process uses. With remove it removes those (not the
	// notes), each after looking again, and lists what it removed. An entry that may still be
	// needed by something the runtime cannot see is a note, never removed.
	StaleShared(hostBase, sandboxesDir string, remove bool) ([]StaleFile, error)
}

// StaleFile is an entry of the host base directory that its runtime made and nothing needs.
type StaleFile struct {
	Name string
	Why  string
	// Note: reported, never removed (something outside the runtime's sight may need it).
	Note bool
}

// Process is a runtime process found by Processes.
type Process struct {
	ID   platform.ProcessID
	Role Role
	// Dir is the state directory of its sandbox (an init's is its shim's).
	Dir string
}

// Role is what a runtime process is to its sandbox.
type Role string

// The roles of runtime processes.
const (
	// RoleShim is a launch's runtime process, whose identity the supervisor records.
	RoleShim Role = "shim"
	// RoleInit is the sandbox's init (its PID 1, the agent), the runtime process's child.
	RoleInit Role = "init"
)

// ResourcePinner is a Runtime whose captures hold state that depends on the resources they
// were captured with (a virtual machine's memory image does), so that a clone of a generation
// must run with the generation's resources. A runtime that is not one, such as the namespace
// runtime, whose generations are files only, lets a clone choose its own.
type ResourcePinner interface {
	// PinsCloneResources reports whether a clone must have its generation's resources.
	PinsCloneResources() bool
}

// MemoryCapturer is a [LiveLayerer] whose live layer is a snapshot of the whole running
// sandbox: its memory and device state with its disk, taken while the supervisor holds it
// frozen, which a clone's launch restores (Spec.Restore) so that what ran at the capture runs
// on. Its generations pin their resources ([ResourcePinner]).
type MemoryCapturer interface {
	// CapturesMemory reports whether the runtime's captures hold memory.
	CapturesMemory() bool
}

// MemorySaver is a [MemoryCapturer] that can save a frozen sandbox's memory and device state
// alone, for a checkpoint whose disk is copied beside it ([FileLayerer]): the files a memory
// generation holds but its disk, in the root of a detached tmpfs that only the returned
// descriptor reaches (closing it frees it). A launch whose top checkpoint layer holds them
// with Spec.Restore restores them, over the layer's disk.
type MemorySaver interface {
	SaveMemory(ctx context.Context, sandboxID, dir string) (*os.File, error)
	// HoldsMemory reports whether the checkpoint layer in dir holds a saved memory, whole.
	HoldsMemory(dir string) bool
}

// SnapshotFlattener is a [LiveLayerer] whose snapshot, or a copy of a stopped sandbox's
// layer file ([FileLayerer]), may name files of the sandbox's own directory (a microVM's
// disk copy backs onto its checkpoint chain or fork-state): FlattenSnapshot makes the one in
// the directory snapshot stand on the image alone, so that what is made of it (a fork) holds
// nothing of its source. It may copy what those files hold into it; the sandbox need not be
// frozen for it.
type SnapshotFlattener interface {
	FlattenSnapshot(ctx context.Context, snapshot *os.File) error
}

// SavedNICer is a [MemoryCapturer] whose memory generations may hold the sandbox's network
// interface among their saved devices, which a restore must have exactly: a clone of a
// generation with one has it whatever its policy (the supervisor takes it down when the clone
// has no network), and one of a generation without one cannot be given a network.
type SavedNICer interface {
	// SavedNIC reports whether the memory generation in dir (a payload directory) was saved
	// with a network interface.
	SavedNIC(dir string) (bool, error)
}

// MemoryReleaser is a [Pauser] that can pause a sandbox with its memory released: saved to
// its state directory and given back to the host, the launch living on. Thaw restores it, and
// Frozen reads it frozen meanwhile.
type MemoryReleaser interface {
	// ReleaseMemory saves the running sandbox's memory and releases it.
	ReleaseMemory(ctx context.Context, sandboxID, dir string) error
}

// LiveLayerer is a Runtime that can open a running sandbox's writable layer for a capture,
// while the supervisor holds the sandbox frozen with its [Pauser].
type LiveLayerer interface {
	// OpenLiveLayer opens the writable layer of the running, frozen sandbox sandboxID in
	// dir, as OpenLayer opens a stopped one's. snapshot says the layer is a copy taken by the
	// call, which stays as it is once the sandbox thaws: the caller may thaw it at once.
	// Otherwise the layer is the sandbox's own, and the sandbox must stay frozen for as long
	// as the caller reads it.
	OpenLiveLayer(ctx context.Context, sandboxID, dir string, disk bool) (layer *os.File, snapshot bool, err error)
}

// Pauser is a Runtime that can pause a sandbox: freeze every process of it, and thaw them
// again. The supervisor keeps the record of a pause; the runtime keeps none, and answers
// Frozen from the host's real state, which the supervisor reconciles with its record.
type Pauser interface {
	// PauseSupport says why this host cannot pause sandboxes, or nil if it can.
	PauseSupport() error
	// Freeze freezes every process of the sandbox and returns once they are frozen. It is
	// idempotent.
	Freeze(ctx context.Context, sandboxID, dir string) error
	// Thaw thaws them. It is idempotent, and leaves nothing of a freeze on the host: a
	// sandbox that was never frozen, or whose cgroup is gone, is thawed already.
	Thaw(ctx context.Context, sandboxID, dir string) error
	// Frozen reports whether the sandbox is frozen (or being frozen).
	Frozen(sandboxID, dir string) (bool, error)
}

// CleanupCheck is what every runtime's Cleanup checks before it releases anything: the
// launch's runtime process id is gone (Cleanup refuses while it lives), and the sandbox id
// and state directory follow the rules a Spec's do. kind names the runtime in the error.
func CleanupCheck(kind, sandboxID, dir string, id platform.ProcessID) error {
	if id.Alive() {
		return fmt.Errorf("%s runtime: the runtime process %s still runs; kill it first", kind, id)
	}
	spec := Spec{ID: sandboxID, Dir: dir, Capability: []byte{1}, LaunchID: "cleanup"}
	return spec.Validate()
}

// EtcHosts is a sandbox's /etc/hosts for its host name: localhost on the loopback addresses,
// and the host name on 127.0.1.1, as Debian has it, so that it resolves without a network.
func EtcHosts(hostname string) string {
	return "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n"
}

// Usage is what a running sandbox has used, as a [Meter] reads it.
type Usage struct {
	platform.CgroupUsage
	// HasDisk says the sandbox has a disk of its own (Spec.DiskMB): DiskUsedBytes is what its
	// writable layer takes of it (the blocks its image holds on the host), DiskLimitBytes
	// its size.
	HasDisk                       bool
	DiskUsedBytes, DiskLimitBytes int64
}

// Meter is a Runtime that can read a running sandbox's usage. The microvm runtime is not one:
// its sandboxes have no cgroup of their own, and the guest's own accounting is not the host's.
type Meter interface {
	// Usage reads the usage of the running sandbox sandboxID in dir. A sandbox whose
	// launch ended has none (an error wrapping fs.ErrNotExist).
	Usage(sandboxID, dir string) (Usage, error)
}
