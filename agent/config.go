package agent

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"time"
)

// UserSpec is who a named user of the sandbox is.
type UserSpec struct {
	UID  uint32
	GID  uint32
	Home string
}

// WorkloadOOMScoreAdj is the oom_score_adj the agent gives every workload it starts, the
// highest there is: when memory runs out, in the sandbox's cgroup or on the host, the OOM
// killer takes a workload, the largest first, before the agent (whose own score its host side
// lowers: the namespace runtime's shim.AgentOOMScoreAdj) and before any process of the host.
// A workload inherits the agent's score at its fork and gets this one right after it: for
// that moment the two are weighed by size. A workload may lower its own score again, down to
// the least it inherited (the agent's), never below; what that can do is said in
// docs/architecture.md ("Out of memory").
const WorkloadOOMScoreAdj = 1000

// Config configures the agent.
type Config struct {
	// ListenPath is the unix socket to listen on; its parent directory is created 0700. The
	// socket appears there (by rename) only once it accepts connections.
	ListenPath string
	// Listener, if set, is used instead of ListenPath: a socket already listening, which the
	// agent closes when it returns. A runtime that makes the socket where the sandbox cannot
	// reach it hands the agent the listening descriptor this way.
	Listener net.Listener
	// Capability is the launch's secret every connection must present in its hello.
	Capability []byte
	// CapabilityFunc, if set, is asked for the capability at each connection instead: a
	// microVM restored from a memory state runs the saved agent on, under the new launch's
	// capability, which its init learns after the agent started.
	CapabilityFunc func() []byte
	// DefaultEnv entries (K=V) are set for every workload, over the built-in defaults (PATH,
	// HOME, USER, LOGNAME, TERM with a tty) and under the request's own.
	DefaultEnv []string
	// Hostname is the sandbox's hostname, for the log only (the runtime sets it).
	Hostname string
	// Users maps "user" and "root" to ids and homes. Missing entries default to uid/gid 1000
	// with home /home/user, and 0 with /root.
	Users map[string]UserSpec
	// Unprivileged runs every workload and file operation as the agent's own user, whatever
	// the request names: for tests and for agents not started as root. It is forced on when
	// the agent's effective uid is not 0.
	Unprivileged bool
	// ReapAll makes the agent reap every child (wait4(-1)), as PID 1 or a child subreaper
	// must. When false it waits only for its own workloads, so that it can share a process
	// with other code that waits for its children (tests). It is forced on as PID 1. At most
	// one agent per process may set it.
	ReapAll bool
	// ShutdownGrace is how long processes get between TERM and KILL when the agent itself is
	// told to stop (a TERM or INT signal to Run, or RunContext's context). Default 5 s.
	ShutdownGrace time.Duration
	// CgroupDir, if set, is the sandbox's cgroup directory as the agent sees it (v2, or v1's
	// memory controller directory); it is read for memory usage and OOM kills.
	CgroupDir string
	// WorkloadTasks and AgentTasks, if set, are the tasks files (cgroup v1, open for writing)
	// of the cgroup the workloads run in and of the agent's own: the agent forks each workload
	// from a thread it moves into the first, and moves back into the second, so that a
	// workload's forks count against the workloads' pids limit and never take the agent's.
	WorkloadTasks, AgentTasks *os.File
	// WorkloadCgroup, if set, is the directory (cgroup v2, open) of the cgroup the workloads
	// run in: each workload is cloned straight into it (CLONE_INTO_CGROUP), so that its forks
	// count against the workloads' pids limit and never take the agent's. v2 places whole
	// processes only, so no thread of the agent moves (see platform's cgroupDriver).
	WorkloadCgroup *os.File
	// WorkloadCapabilities, if set, bounds every workload's capabilities: it is forked from
	// a thread whose bounding set the agent first limits to these names (such as "CAP_KILL";
	// the thread keeps its own permitted set). A sandbox's init limits the permitted sets of
	// all the agent's threads at once but bounds only its own thread, since the bounding set
	// can be changed for the whole process only by one stop of the Go runtime per capability.
	// The agent needs CAP_SETPCAP for it.
	WorkloadCapabilities []string
	// ConfigureNetwork, if set, serves control's network operation (and the agent announces
	// it, and its down form): it gives the sandbox's eth0 address and routes through gateway,
	// or, given the zero address and gateway, takes eth0 down. A microVM's guest sets it; a
	// namespace sandbox's eth0 is configured from the host.
	ConfigureNetwork func(ctx context.Context, address netip.Prefix, gateway netip.Addr) error
	// Logger receives the agent's log; default slog.Default().
	Logger *slog.Logger
}

// Version is the agent version reported in hello.
const Version = "bothy-agent/1"

const (
	defaultPath    = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	defaultTerm    = "xterm-256color"
	defaultGrace   = 5 * time.Second
	defaultRows    = 24
	defaultCols    = 80
	defaultUID     = 1000
	defaultHome    = "/home/user"
	defaultRootDir = "/root"
)
