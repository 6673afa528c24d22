// Package agent is the program that runs as PID 1 inside a sandbox: it serves the control
// protocol (package control) on a unix socket, runs the workloads exec requests ask for,
// serves files, reaps zombies, and ends the sandbox on request. The namespace runtime's init
// calls [Run] after it set up the root file system; tests call [RunContext] without namespaces.
// It does not set up namespaces, mounts, cgroups, seccomp or no_new_privs: the runtime has
// done all of that before the agent starts, so it applies to the agent and every workload.
// It imports no host-side package of bothyd: it runs inside the sandbox, from
// bothyd-runtime as well as bothyd. It refuses to serve without a capability
// ([Config].Capability), which every control connection must present.
//
// # PID 1 duties
//
// A reaper collects every child's exit status with wait4 on SIGCHLD. As PID 1 (or with
// [Config].ReapAll, as a child subreaper) it waits for any child (wait4(-1)), so orphans the
// workloads leave behind do not linger as zombies; statuses of workloads are handed to the
// exec that started them, others are dropped. A workload is registered in the same critical
// section that forks it, so its status cannot be stolen. os/exec's Wait is never used.
//
// TERM and INT to the agent (Run) end the sandbox: every process gets TERM, then KILL after
// [Config].ShutdownGrace, and Run returns. The shutdown operation does the same with the
// grace it names; as PID 1 the signals go out with kill(-1), which reaches every process of
// the pid namespace but the agent.
//
// Every other signal a process can catch is caught and dropped by Run, but those the Go
// runtime needs (CHLD, URG, PROF, PIPE and the C libraries' thread signals): root inside the
// sandbox may signal PID 1, and QUIT, ABRT, HUP or a SEGV sent with kill must neither end
// the sandbox nor dump the agent's stacks into its log.
//
// # Exec
//
// A workload runs as the request's user ("user": uid/gid 1000 with home /home/user, or
// "root"), with no supplementary groups, in its own process group, or with a tty in its own
// session with the pty as controlling terminal. Its environment is PATH, HOME, USER,
// LOGNAME (and TERM=xterm-256color with a tty), then [Config].DefaultEnv, then the request's.
// Its umask is the request's, or [control.DefaultUmask] (022): never the agent's own, which
// as the sandbox's init is 0. The umask is process-wide, so it is set around the fork only;
// the agent's own file operations set every mode exactly and do not depend on it.
// The timeout and the client's going away SIGKILL the process group (with a tty, every
// process of the session). Signals from the client go to the process group. The exit status
// follows the shell's convention: a signal's death is 128+n with the signal's name.
//
// Output flows from the pipes (1 MiB where the kernel allows, or the pty) into the stream in
// frames of 32 KiB, growing to 256 KiB while the workload keeps them full, and no faster than
// the client reads: the workload blocks on a full pipe rather than the agent buffering. A
// stdout pipe that bothyd passed with the request (control.FeatureStdoutPipe) becomes the
// workload's stdout as it is: the agent never reads it, and bothyd does.
// After the workload exits its output is drained until the pipes close or stay silent for
// 100 ms, so a background process that inherited them does not hold the exec open.
//
// # Files
//
// File operations run with the file-system identity of the request's user: on a dedicated OS
// thread the agent drops its groups and sets fsuid and fsgid, and the thread is discarded
// afterwards. The kernel thus checks every path as it would for the user, symbolic links
// included, and the agent lends no root permission. Writes go to a temporary file in the
// target's directory that is synced and renamed into place; only regular files are read.
// Reading and listing refuse the user /proc, where the agent's own entries would show. A
// listing stops at the request's limit (control.Serve enforces it). A recursive remove walks
// the tree with platform.RemoveTreeAt: a bounded number of descriptors however deep the
// tree, no link followed, no mount point entered.
//
// # Unprivileged
//
// When the agent is not root (or [Config].Unprivileged is set) it cannot switch users: every
// workload and file operation runs as the agent's own user. Outside PID 1 without ReapAll, it
// waits only for its own workloads and shuts down only their process trees, so that tests can
// run several agents in one process.
package agent
