package shim

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// The sub-commands of the runtime binary (bothyd, or bothyd-runtime) that the namespace
// runtime runs as: cmd/ dispatches os.Args[1] to [Main] before anything else.
const (
	ShimCommand = "__shim"
	InitCommand = "__init"
	// ReleaseCommand is the releaser (release_linux.go): bothyd __release <dir>, with the
	// overlay at fd 3 and the disk's lock at fd 4 (either may be absent).
	ReleaseCommand = "__release"
)

// Names the namespace runtime keeps in a state directory. The host-side driver creates some
// of them before a start and reads others (the writable layer, for a capture); the shim and
// the init use them all.
const (
	// EntryControl holds the control socket, SocketName, which the shim makes and listens on
	// and whose listening descriptor the agent inherits; nothing inside the sandbox sees it.
	EntryControl = "control"
	EntryUpper   = "upper"  // the overlay's writable layer: the sandbox's own files
	EntryWork    = "work"   // the overlay's work directory
	EntryRootfs  = "rootfs" // the overlay's mount point (in the sandbox's mount namespace)
	EntryBase    = "base"   // the host image's base layer when it is not shared (Spec.HostBase "")
	// EntryHostFiles held the sandbox's own /etc/hostname and /etc/hosts, a layer right
	// above the host image's shared base, which the shim now makes on a tmpfs of its own;
	// a state directory of an earlier version may hold it, which a start removes.
	EntryHostFiles = "hostfiles"
	EntryLog       = "sandbox.log" // the shim's and the init's output
	// With a disk of its own (Spec.DiskMB), the sandbox's writable layer (upper and work)
	// lives on an ext4 file system in EntryDiskImage, which the init mounts detached, at no
	// path. EntryDisk, its mount point before, is no longer made; a state directory of an
	// earlier version may hold it (empty).
	EntryDisk      = "disk"
	EntryDiskImage = "disk.img"
	SocketName     = "control.sock"
)

// AgentPids is the allowance of tasks (processes and threads) that the shim adds to a
// sandbox's pids limit for its init, which becomes the agent: a Go program whose runtime
// threads count against the cgroup's pids.max like any workload's. Idle, the agent holds about
// 9 threads; each blocking system call in flight (a file operation, of which a sandbox has at
// most 16, or an exec's wait) can take one more. Without the allowance a small `pids` left no
// room for the agent (below 6 the sandbox never came up, at 8 it ran but could start no
// command); with it, `pids: N` leaves at least N to the workload.
//
// The allowance is the agent's own: the workloads live in a cgroup of their own limited to
// N, so a workload that forks without end is refused its forks there and never takes the
// thread the agent needs to answer (or to live: a Go runtime that cannot make a thread
// dies). On cgroup v1 that is [WorkloadCgroup], a child of the sandbox's pids cgroup
// limited to N and the forking thread; on v2 (where a cgroup with children holds no process
// of its own) the sandbox's cgroup has two children, platform.V2AgentCgroup with the agent
// and platform.V2WorkloadsCgroup limited to N, into which each workload is cloned
// (platform.Cgroup.SplitV2).
const AgentPids = 32

// AgentMemory is the allowance of memory that the shim adds, on cgroup v2, to a sandbox's
// memory limit for its agent, whose workloads get a memory cgroup of their own with the
// sandbox's limit (platform.Cgroup.SettleV2): a workload that runs out of memory is then
// OOM-killed among the workloads, and the agent, beside them, answers on. Idle, the agent
// holds about 4 MiB; each exec buffers at most 1 MiB per stream. On cgroup v1 the memory
// hierarchy has no such child and the two share the sandbox's limit: there the OOM scores
// ([AgentOOMScoreAdj]) keep the agent out of the OOM killer's choice.
const AgentMemory = 32 << 20

// AgentOOMScoreAdj is the oom_score_adj that the shim, from the host, gives the sandbox's
// init, which becomes the agent (platform.SetOOMScoreAdj): the OOM killer then takes the
// agent last, after any workload, whose own score the agent raises (agent.WorkloadOOMScoreAdj).
// On cgroup v1 the agent shares the sandbox's memory cgroup with its workloads, and without
// it the agent, a Go program of a few MiB, was the OOM killer's pick as soon as the workloads'
// memory was spread over processes each smaller than it (sixteen pipelines at once in 64 MiB;
// tests/oom_test.go); on v2 the workloads have a memory cgroup of their own ([AgentMemory]),
// and the score still orders a kill at the sandbox's cgroup or the host's. Not -1000, which
// the OOM killer never kills: the shim's write, made with CAP_SYS_RESOURCE, is also the least
// score that the agent's children inherit and may set themselves back to, and a workload at
// -1000 beside an agent at -1000 would leave the OOM killer nothing to kill, the sandbox
// stuck at its limit. At -999 the two are weighed by their size. A process inside a user
// namespace cannot lower its own score, so the agent cannot do this itself.
const AgentOOMScoreAdj = -999

// WorkloadCgroup is the child of a sandbox's pids cgroup (cgroup v1, with a pids limit) that
// the agent starts every workload in: the shim makes it with the sandbox's pids limit (plus
// one: the agent's thread that forks a workload counts there while it forks) and hands the init the tasks files of it and of the sandbox's cgroup (fds 6 and 7), between
// which the agent moves the thread that forks a workload.
const WorkloadCgroup = "workload"

// Config is what the host-side driver hands the shim on its fd 3.
type Config struct {
	Spec   runtime.Spec `json:"spec"`
	Cgroup string       `json:"cgroup"`
	// Seccomp is the sandbox's seccomp filter, compiled by the host-side driver, in the binary
	// form of [github.com/bothy/bothy/platform.SeccompProgram].
	Seccomp []byte `json:"seccomp"`
	// IDs is the sandbox's user namespace.
	IDs IDConfig `json:"ids"`
	// ReleaseSocket, unless empty, is the unix socket of the bothyd that takes a launch's
	// release off the shim (see [ServeReleases]); without it, or when nothing answers
	// there, the shim starts a releaser process.
	ReleaseSocket string `json:"release_socket,omitempty"`
	// Mounts are the mechanisms that this kernel gives the shim to build the sandbox's root
	// with, chosen once at the runtime's start-up by its probes.
	Mounts Mounts `json:"mounts"`
}

// Mounts are the mechanisms the shim builds a sandbox's root with, chosen once by the
// host-side driver's start-up probes (the namespace runtime's probeMounts) for the kernel it
// runs on, each the best one that kernel has.
type Mounts struct {
	// OverlayLayers is how overlayfs is handed its layers: as descriptors (Linux 6.13), or by
	// the /proc/self/fd paths of descriptors the shim holds (every kernel). "" is descriptors.
	OverlayLayers platform.OverlayLayers `json:"overlay_layers,omitempty"`
	// TmpfsIDMap says that tmpfs takes idmapped mounts (Linux 6.3): the host files' layer, a
	// tmpfs, is then idmapped like every other layer. Without it, that layer is made owned by
	// the host id of the sandbox's root (its root directory by tmpfs's uid= and gid=, its files
	// by fchown), which shows inside as root's, as the idmapped layer does.
	TmpfsIDMap bool `json:"tmpfs_idmap,omitempty"`
}

// overlayLayers is m.OverlayLayers with its default.
func (m Mounts) overlayLayers() platform.OverlayLayers {
	if m.OverlayLayers == "" {
		return platform.OverlayLayersByFD
	}
	return m.OverlayLayers
}

// IDRangeSize is how many ids a sandbox's user namespace maps: ids 0 to 65535 inside (root,
// the workload user 1000, nobody 65534) are the host ids Base+slot*IDRangeSize onwards.
const IDRangeSize = 65536

// IDConfig says how the shim gives its sandbox a user namespace with a range of host ids of
// its own. Slot n of the registry (a host-wide lock file, shared by every bothyd on the
// host) is the host ids Base+n*IDRangeSize to Base+(n+1)*IDRangeSize-1; the shim holds its
// slot for its whole life, and the kernel releases it when the shim ends, however it ends.
type IDConfig struct {
	// Off runs the sandbox without a user namespace: its ids are the host's.
	Off bool `json:"off,omitempty"`
	// Base is the first host id of slot 0; Slots is how many slots there are.
	Base  uint32 `json:"base"`
	Slots int    `json:"slots"`
	// Registry is the lock file of the slots, absolute.
	Registry string `json:"registry"`
}

// CgroupLeaf names a sandbox's cgroup below the runtime's parent: its id, a dot (which no id
// contains), and a hash of its state directory, so that sandboxes of one id in two state roots
// (two bothyd instances, or tests) never share a cgroup, where ending one would end both.
func CgroupLeaf(id, dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return id + "." + hex.EncodeToString(sum[:4])
}

// Main runs the sub-command that args (os.Args[1:]) names, if it names one of this runtime's:
// the shim ([ShimCommand]) or the sandbox's init ([InitCommand]), which becomes the agent. It
// returns the process's exit code and whether args named a sub-command. Every binary that the
// runtime executes as shim and init (bothyd, bothyd-runtime, and test binaries that
// re-execute themselves) calls it first thing in main or TestMain.
func Main(args []string) (code int, ran bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case ShimCommand:
		return ShimMain(args[1:]), true
	case InitCommand:
		return InitMain(args[1:]), true
	case ReleaseCommand:
		return ReleaseMain(args[1:]), true
	}
	return 0, false
}
