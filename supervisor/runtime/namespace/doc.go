// Package namespace is sandboxd's default runtime: each sandbox is a tree of processes in its
// own Linux mount, pid, uts, ipc, network and cgroup namespaces, on an overlay root, with its
// limits in a cgroup, its capabilities bounded, no_new_privs and a seccomp filter. It starts
// in milliseconds and needs nothing but the sandboxd binary. It must not keep records or take
// locks: the supervisor does, under the sandbox's lifecycle lock.
//
// # The process tree
//
//	sandboxd                      the server; need not be anyone's parent
//	└─ sandboxd __shim <dir>      the runtime process: own session, detached, outlives sandboxd
//	   └─ sandboxd __init <dir>   PID 1 of the sandbox, in new namespaces and the sandbox's cgroup
//	      (exec'd in place as "sandboxd __init <dir> agent": the agent, with dropped privileges)
//	      └─ workloads            run by the agent as "user" (uid 1000) or "root"
//
// Start re-executes sandboxd as the shim (stdout and stderr to <dir>/sandbox.log, replaced at
// each start) and hands it the spec, capability included, on a pipe (fd 3); the shim's
// identity (pid, start time, boot id) is what the supervisor records. The shim creates the
// cgroup and starts the init with clone flags for the new namespaces, handing it its part of
// the spec on another pipe (fd 3) and a lifeline pipe (fd 4) whose write end only the shim
// holds. The shim is the init's parent, so it always learns how the sandbox ended, also while
// sandboxd is down: it then writes outcome.json, removes the cgroup and exits.
//
// The init runs in two stages. The first, with full privileges, builds the root file system,
// sets the host name, brings loopback up and pivots into the new root; then, on its own
// thread, it bounds its capabilities, sets no_new_privs, installs the seccomp filter and
// re-executes itself from a descriptor of the sandboxd executable opened before the pivot.
// The exec replaces every other thread, so the second stage — the agent — and everything it
// starts carry exactly those privileges (capabilities and no_new_privs are per thread in
// Linux, which a multi-threaded Go process could not otherwise drop for good). The agent
// receives the capability on a pipe: no file inside the sandbox holds it.
//
// cmd/sandboxd must dispatch the hidden sub-commands before anything else:
//
//	switch os.Args[1] { case namespace.ShimCommand: os.Exit(namespace.ShimMain(os.Args[2:]))
//	case namespace.InitCommand: os.Exit(namespace.InitMain(os.Args[2:])) }
//
// # What is mounted where, and why
//
// All mounts are made by the init inside its own mount namespace, after making every mount
// private (MS_PRIVATE|MS_REC on /): nothing propagates to the host, and everything vanishes
// when the namespace's last process dies, so no mount can leak.
//
//   - / is an overlay on <dir>/rootfs: lower layers are the spec's Lowers (template
//     generations, top first) then the image; the upper layer is <dir>/upper (work dir
//     <dir>/work). It is nodev and nosuid. An image is a directory under <root>/images/<name>/;
//     the built-in "host" image is <dir>/base, generated at each start: the directory
//     skeleton, the merged-usr links (/bin, /sbin, /lib, /lib64 as the host has them), and a
//     generated /etc (passwd with root and user, group, hosts with the host name, hostname,
//     resolv.conf, nsswitch.conf, and public host files: os-release, ld.so.cache, the
//     /etc/alternatives links). /tmp and /home/user (owned by 1000) live on the upper layer.
//   - /usr (host image only) is the host's /usr, bound read-only, nosuid, nodev; so are the
//     top-level /bin, /lib... of a host where they are directories rather than links.
//   - /proc is a new proc of the sandbox's pid namespace, so only its own processes show;
//     /proc/sys, /proc/irq, /proc/bus and /proc/fs are read-only binds (root in the sandbox
//     cannot change host-wide kernel settings), and /proc/kcore, keys, sysrq-trigger,
//     timer_list and the like are masked with /dev/null.
//   - /dev is a small tmpfs (nodev itself) with null, zero, full, random, urandom and tty
//     bound from the host's nodes, a new devpts instance at /dev/pts with /dev/ptmx linking
//     into it, a tmpfs at /dev/shm, and the /dev/fd, stdin, stdout, stderr links.
//   - /run/sandboxd is a bind of <dir>/control, the only part of the state directory visible
//     inside: it holds the agent's control.sock and is root's alone (0700), so a workload
//     running as user cannot reach the socket.
//
// Nothing else of the host is visible: the old root is detached after pivot_root, so the
// host's /root, /home, /etc/shadow, the state root and other sandboxes are unreachable. The
// network namespace has only loopback, brought up by the init.
//
// # Limits and privileges inside
//
// The cgroup is <CgroupParent>/<id> ("sandboxd/<id>"): on cgroup v1 one directory in each of
// the memory (limit, and memory+swap where accounted), cpu (CFS quota = vcpus × period) and
// pids hierarchies; on cgroup v2 (where memory, cpu and pids are enabled) one directory. On v1
// the shim's forking thread alone enters the cgroup for the fork, so the init is born inside
// it and its cgroup namespace is rooted there; on v2 the init is cloned into it
// (CLONE_INTO_CGROUP). An out-of-memory kill is read from memory.oom_control (v1) or
// memory.events (v2) into the outcome.
//
// The agent keeps Docker's default capability set minus CAP_MKNOD (platform.
// DefaultCapabilities) as bounding, permitted and effective set: enough to switch to the
// workload user and to signal workloads. A workload run as user gets no capability (the uid
// change clears them; ambient is empty); one run as root gets that same set. no_new_privs
// makes set-user-ID binaries and file capabilities inert. The seccomp filter is Docker's
// default profile (github.com/moby/profiles/seccomp) for that capability set, compiled to
// BPF in pure Go; it covers the agent and every workload.
//
// # Crashes
//
//   - sandboxd dies: nothing happens to the sandbox; the shim is in its own session and not
//     sandboxd's child in any way that matters. A restarted sandboxd finds it by the runtime
//     record and reattaches.
//   - The shim dies (even SIGKILL): the init has PR_SET_PDEATHSIG=SIGKILL, set before it
//     checks the lifeline (so a shim that died before the signal was armed is noticed too);
//     the init's death ends its pid namespace, killing every workload. No outcome report is
//     written; the supervisor sees the runtime process gone and calls Cleanup, which removes
//     the cgroup (killing anything left in it). Mounts need no cleanup: they lived in the
//     dead mount namespace.
//   - The init or agent dies: the pid namespace ends with it; the shim writes the outcome
//     (exit code or signal, OOM), removes the cgroup and exits.
//   - The host crashes: the boot id changes, so every recorded identity reads as gone; the
//     cgroup and mounts were in memory and are gone too.
//   - A sandbox is killed (Kill): its init is killed by verified identity (a pidfd, checked to
//     still be the shim's child); the shim records the outcome. If the shim lingers, it is
//     killed too.
//
// # Privileges required
//
// sandboxd must run as root (uid 0 with a full capability set: CAP_SYS_ADMIN for mounts,
// namespaces and seccomp, CAP_SYS_CHROOT for pivot_root, CAP_SETUID/CAP_SETGID, CAP_SETPCAP to
// bound capabilities, CAP_DAC_OVERRIDE for state directories) with write access to the cgroup
// hierarchy (/sys/fs/cgroup mounted read-write). In a container that means --privileged, or
// at least CAP_SYS_ADMIN, an unconfined seccomp and AppArmor profile, and a writable cgroup
// mount. Rootless operation (a user namespace with mapped ids) is not implemented: New
// refuses to run without root, with an error that says so.
package namespace
