package namespace

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/supervisor/runtime"
)

// The hidden sub-commands of the sandboxd binary that this runtime re-executes:
// cmd/sandboxd dispatches on os.Args[1] and calls ShimMain or InitMain with os.Args[2:].
const (
	ShimCommand = "__shim"
	InitCommand = "__init"
)

// CgroupLeaf names a sandbox's cgroup below the runtime's parent: its id, a dot (which no id
// contains), and a hash of its state directory, so that sandboxes of one id in two state roots
// (two sandboxd instances, or tests) never share a cgroup, where ending one would end both.
func CgroupLeaf(id, dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return id + "." + hex.EncodeToString(sum[:4])
}

// Kind is this runtime's kind.
const Kind = "namespace"

// Names this runtime keeps in a state directory.
const (
	entryControl = "control" // the agent's socket directory, the only part visible inside
	entryUpper   = "upper"   // the overlay's writable layer: the sandbox's own files
	entryWork    = "work"    // the overlay's work directory
	entryRootfs  = "rootfs"  // the overlay's mount point (in the sandbox's mount namespace)
	entryBase    = "base"    // the host image's base layer when it is not shared (Spec.HostBase "")
	// entryHostFiles is the sandbox's own /etc/hostname and /etc/hosts, a layer right above
	// the host image's shared base.
	entryHostFiles = "hostfiles"
	entryLog       = "sandbox.log" // the shim's and the init's output
	// With a disk of its own (Spec.DiskMB), the sandbox's writable layer (upper and work)
	// lives on an ext4 file system in entryDiskImage, which the init mounts on entryDisk
	// inside its own mount namespace.
	entryDisk      = "disk"
	entryDiskImage = "disk.img"
	socketName     = "control.sock"
)

// OutcomeName is the outcome report the shim writes (through the store) when the sandbox ends.
const OutcomeName = store.OutcomeName

// ListenPath is where the agent listens, inside the sandbox.
const ListenPath = "/run/sandboxd/" + socketName

// DeclaredEntries lists the names the runtime keeps in a state directory.
func declaredEntries() []runtime.Entry {
	return []runtime.Entry{
		{Name: entryControl, Dir: true},
		{Name: entryUpper, Dir: true},
		{Name: entryWork, Dir: true},
		{Name: entryRootfs, Dir: true},
		{Name: entryBase, Dir: true},
		{Name: entryHostFiles, Dir: true},
		{Name: entryLog},
		{Name: entryDisk, Dir: true},
		{Name: entryDiskImage},
	}
}

// AgentConfig is what the init hands the agent once the sandbox is set up.
type AgentConfig struct {
	// ListenPath is the control socket to listen on.
	ListenPath string
	// Capability is the launch's secret, required on every control connection.
	Capability []byte
	// Env is the default environment of workloads.
	Env map[string]string
	// Hostname is the sandbox's host name.
	Hostname string
	// CgroupDir is the sandbox's own cgroup as mounted read-only inside (v2, or v1's memory
	// hierarchy), for memory statistics and OOM counts; "" if it could not be mounted.
	CgroupDir string
}

// RunAgent runs the in-sandbox agent as PID 1 and returns when it is told to shut down. The
// init calls it last, with the capabilities, no_new_privs and seccomp filter of the sandbox
// already in force.
var RunAgent func(AgentConfig) error
