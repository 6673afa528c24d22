// Package namespace is the host-side driver of bothyd's default runtime ([runtime.Runtime]):
// each sandbox is a tree of processes in its own Linux user, mount, pid, uts, ipc, network
// and cgroup namespaces, on an overlay root, with its limits in a cgroup, its capabilities
// bounded, no_new_privs and a seccomp filter. It needs the bothyd binary alone (and mke2fs
// for a sandbox with a disk of its own).
//
// The driver starts, kills, finds and cleans up after runtime processes; it keeps no records
// and takes no locks (the supervisor does both, under the sandbox's lifecycle lock). The
// processes themselves are package [shim], the sandbox side, which imports nothing of the
// host side; every binary that this runtime executes calls [shim.Main] first thing in main.
// Without root, [New] still returns a runtime, so that such a server still serves its state;
// its [Runtime.Start] and [Runtime.DiskSupport] then fail with [errcode.Unavailable].
//
// # Processes
//
//	bothyd __shim <dir>      the runtime process: own session, outlives bothyd
//	└─ bothyd __init         PID 1 of the sandbox, in its namespaces and cgroup; sets the
//	   │                       sandbox up, drops to its privileges, runs the agent
//	   └─ workloads            run by the agent as "user" (uid 1000) or "root"
//
// Start prepares the state directory <dir>, execs [Config.Executable] as the shim, with its
// output to <dir>/sandbox.log (replaced at each start), and hands it a [shim.Config] (the
// spec, capability included, and the seccomp filter that New compiled once, package
// [seccomp]) on fd 3. It returns the shim's identity ([platform.ProcessID]), which is what the
// supervisor records. The shim is the init's parent, so it learns how the sandbox ended also
// while bothyd is down: it writes outcome.json ([runtime.WriteOutcome]), removes the
// cgroup and exits. Capabilities, no_new_privs and the filter reach every thread of the agent
// before it runs, so the agent and everything it starts carry exactly the sandbox's
// privileges. The capability travels on pipes only, never in a file inside the sandbox.
//
// # Ids
//
// Each running sandbox has a user namespace whose ids 0-65535 are 65536 unprivileged host ids
// of its own: slot n of a host-wide registry ([Config.IDs], [DefaultIDRegistry]), the host ids
// [DefaultIDBase]+n*65536 onwards, skipping any that /etc/subuid or /etc/subgid hand to a
// user. The shim takes its slot before it clones the init, as an open file description lock
// on byte n of the registry, and holds it until it exits; the kernel releases it however the
// shim ends, so no crash leaks a slot, nothing needs reclaiming, and no two live sandboxes
// share one (a sandbox's processes die with its init, which dies with the shim). Root inside
// is the slot's first host id, the workload user 1000 is that plus 1000: no per-user kernel
// counter (RLIMIT_NPROC, inotify instances, user namespaces) of a sandbox is a host user's.
// The namespace is owned by the slot's first id too (the shim's forking thread takes that
// effective id for the clone): the kernel also counts what a sandbox holds against its
// namespace's owner in the host's namespace, which must not be host root.
//
// Ownership on disk stays the sandbox's own: 1000 inside is 1000 in upper/, in template
// generations and on a disk of its own, 0 is the sandbox's root, whichever slot it runs in.
// Every layer is an idmapped mount (MOUNT_ATTR_IDMAP) by the sandbox's mapping, and so is the
// host's /usr (root's files show as root's inside; a host file system that cannot be
// idmapped is bound as it is, its files then nobody's). The kernel lets only host root make
// idmapped mounts, and only host root's overlay keeps opaque directories in trusted.*
// xattrs, the layers' format: so the shim, not the init, makes the overlay over idmapped
// clones of the layers, and hands it and the host binds to the init as descriptors with its
// configuration (one message on a socket, fd 3). It makes the overlay as the slot's first id
// (with host root's capabilities), so that the overlay's own files, whiteouts and its work
// directory, are written as the sandbox's root, 0 on disk. The sandbox's own mounts (proc,
// /dev's tmpfs and devpts, /run/bothyd, the cgroup) are made by the init inside the
// namespace; the host's device nodes show as nobody's.
//
// Root inside holds its capabilities in its namespace alone: over the host's files (host
// root's, unmapped) it has none, and its capability set is bounded as before. The init sets
// its namespace's max_user_namespaces to 0, and the seccomp filter refuses unshare, setns and
// namespace flags to clone: nothing inside makes a user namespace of its own, the door to
// most of the kernel that unprivileged users reach. [Config.IDs] Off runs sandboxes without
// a user namespace (host ids): for state roots and images on a file system that cannot be
// idmapped (overlayfs, NFS), where a start otherwise fails, and for measuring.
//
// # The root file system
//
// The init makes every mount inside its own mount namespace, after making / private: nothing
// propagates to the host, and every mount ends with the namespace. It attaches the overlay
// on <dir>/rootfs, its working directory (inherited from the shim: in its user namespace it
// may not look the state directory up), and the tree it mounts on is the sandbox's, links
// included: every directory,
// file and link it makes below the new root, and every mount target, is resolved through a
// handle of the root as if the root were "/" (openat2 RESOLVE_IN_ROOT), and every mount is
// made detached and attached onto a handle of its target (move_mount), so that a link
// planted inside (a /sys pointing at a host directory) is followed inside or fails the
// start, and never leads out. The overlay's layers are detached clones of their mounts, so
// the sandbox's mount table names them "/", "/upper" and "/work" (or /proc/self/fd/<n>, on a
// kernel before 6.13 that takes no layer as a descriptor), not by their host paths.
//
//   - / is a nodev, nosuid overlay on <dir>/rootfs. Its lowers are, top first, Spec.Lowers
//     (template generations) and then Spec.ImageDir, or, for the built-in host image
//     (ImageDir ""), the sandbox's /etc/hostname and /etc/hosts, on a small detached tmpfs
//     that the shim makes at every start, over the host base layer. Its upper and work
//     directories are <dir>/upper and <dir>/work, or, with a disk of its own (Spec.DiskMB),
//     the same names on an ext4 image <dir>/disk.img that Start makes and the shim
//     loop-mounts as a detached mount, at no path (the state directory then has no upper
//     and work).
//   - The host base layer holds the directory skeleton, the host's merged-usr links and a
//     generated /etc (passwd, group, nsswitch.conf, resolv.conf, and public host files such
//     as os-release and ld.so.cache). It holds nothing of any sandbox, so one copy is shared
//     read-only by every sandbox that names the same Spec.HostBase (the supervisor gives one
//     per state root; "" means <dir>/base). Its directory is named by a hash of its format and
//     content, so a changed host gets a new layer; it is built under a temporary name and
//     renamed into place, so that no start sees a partial one.
//   - Host image only: the host's /usr, top-level /bin, /lib... where they are directories,
//     and /etc/alternatives, bound read-only, nosuid, nodev.
//   - /proc is the sandbox's own, with /proc/sys, irq, bus, fs and asound read-only and
//     kcore, keys, sysrq-trigger, kmsg and the like masked by /dev/null.
//   - /dev is a small nodev tmpfs with null, zero, full, random, urandom and tty bound from the
//     host, a new devpts instance, and a tmpfs /dev/shm.
//   - The sandbox's own cgroup, read-only, at /sys/fs/cgroup/memory (v1) or /sys/fs/cgroup
//     (v2); the cgroup namespace is rooted at it. Nothing else of /sys.
//   - /run/bothyd is a small, empty tmpfs, root's alone (0700). Nothing of the state
//     directory is visible inside.
//   - Volumes (Spec.Volumes, docs/volumes.md): the shim clones each volume's host mount,
//     nosuid, nodev, read-only if asked, idmapped by the sandbox's mapping like the layers (a
//     volume that cannot be idmapped fails the start), and the init attaches it at its path
//     after the host binds, resolved inside the root. Every sandbox mounting a volume shares
//     its one superblock, and so each other's writes.
//
// The control socket is <dir>/control/control.sock ([Runtime.ControlPath]). The shim makes
// it and listens on it before it starts the init, and hands the listening descriptor down
// (fd 5); the agent accepts on it. The directory is never mounted inside, so nothing in the
// sandbox can rename, replace or add the entry that bothyd connects to, and nothing it
// writes reaches the host's state root. A connection's peer credentials (SO_PEERCRED) are
// the shim's, the process that listened, whose identity Start returns: bothyd can check
// them before it sends the capability.
//
// The old root is detached after pivot_root: nothing else of the host (its /root, /home,
// /etc/shadow, the state root, other sandboxes) is reachable. The network namespace has only
// loopback.
//
// # Limits and privileges
//
// The cgroup is <Config.CgroupParent>/<[shim.CgroupLeaf]>: on v1 a directory in each of the
// memory (with memory+swap where accounted), cpu (CFS quota) and pids hierarchies, on v2 one
// directory whose ancestors all delegate memory, cpu and pids (so the parent must not be a
// cgroup that holds processes; only the missing controllers are written, systemd owning the
// levels above a delegated parent). On v1 the shim's forking thread enters the cgroup for the
// fork alone; on v2 the init is cloned into it (CLONE_INTO_CGROUP) and makes its cgroup
// namespace once inside. Either way the namespace is rooted at the sandbox's cgroup, which
// is what the read-only cgroup mount at /sys/fs/cgroup shows inside. On v2 the shim itself
// was started in <Config.CgroupParent>/runtime (runtime.SpawnDetached), outside bothyd's
// cgroup, so that a restart of bothyd's systemd unit kills no sandbox. An out-of-memory kill goes into the outcome. The cgroup's pids.max
// is the sandbox's pids limit plus [shim.AgentPids], since the agent's own threads count
// against it: `pids: N` leaves the workload at least N processes and threads. On v1 the
// workloads run in a child of the pids cgroup ([shim.WorkloadCgroup], pids.max N+1: the
// agent's forking thread is there while it forks) so that a workload forking without end is
// refused there (a command started meanwhile is refused with pids-limit) and never takes the
// threads the agent needs; the agent moves its forking thread between the two with tasks
// files the shim opened (the kernel judges such a write by the opener), which it holds
// close-on-exec and, not dumpable, out of the workloads' reach. On v2, which places whole
// processes only, the sandbox's cgroup has two children: agent, into which the shim moves
// the init once it made its cgroup namespace (one byte each way on the configuration
// socket), and workloads (pids.max N), into which the agent clones each workload
// (CLONE_INTO_CGROUP) through a directory descriptor the shim opened; the cgroup.procs files
// that clone checks are the sandbox's root's host uid's, nothing else (platform.Cgroup.SplitV2
// says why root inside gains nothing by it). Where v1 and v2 differ is said once, on
// platform's cgroupDriver.
//
// The init holds the sandbox's capability set plus CAP_SYS_ADMIN, CAP_NET_ADMIN and
// CAP_SYS_RESOURCE (all in its user namespace), which it drops before the agent runs. The agent keeps [platform.DefaultCapabilities] (Docker's
// default set minus CAP_MKNOD); a workload run as user gets none, one run as root gets that
// set. no_new_privs makes set-user-ID binaries and file capabilities inert; the agent is not
// dumpable, so no workload reaches its memory or descriptors through /proc/1. The seccomp
// filter is Docker's default profile for that capability set; it covers the agent and every
// workload.
//
// # Crashes
//
//   - bothyd dies: the sandbox runs on; a restarted bothyd finds the shim by its recorded
//     identity.
//   - The shim gets TERM, INT or HUP: it forwards TERM to the init, whose agent ends the
//     sandbox gracefully, and records the outcome as usual.
//   - The shim dies, even by SIGKILL: the init dies by its parent-death signal (armed before
//     it checks that the shim still holds its lifeline, fd 4), and with it its pid namespace
//     and mounts. No outcome is written; the supervisor calls [Runtime.Cleanup], which removes
//     the cgroup and anything mounted below the state directory on the host.
//   - The shim dies while it sheds its set-up (its exec of itself, 10 s into the sandbox's
//     life): as any death of the shim. An exec that fails leaves the old shim waiting, with
//     its set-up; one that succeeds is the same process, pid and start time, so its recorded
//     identity holds. A TERM, INT or HUP in the millisecond of the exec may end it: as any
//     death of the shim.
//   - The init or agent dies: the shim writes the outcome, removes the cgroup, hands the
//     overlay it holds and the disk's lock to a releaser (bothyd __release <dir>) and exits;
//     the releaser's close shuts the overlay and the disk down, after the stop has answered
//     (docs/design.md, "The release"). The next launch, and a capture, wait for the disk's
//     lock ([shim.LockDisk]) before they mount the image again.
//   - The releaser dies, even by SIGKILL: the release happens in its exit, and its lock ends
//     with it. Nothing records a releaser, since nothing of it can be left.
//   - The host crashes: the boot id changes, so every recorded identity reads as gone.
//   - [Runtime.Kill] kills the init by verified identity (a pidfd of a process checked to be
//     the shim's child), and the shim too if it lingers.
//
// # Privileges required
//
// Root with a full capability set (CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETUID, CAP_SETGID,
// CAP_SETPCAP, CAP_DAC_OVERRIDE) and a writable cgroup hierarchy; in a container, that means
// --privileged or the equivalent; Linux 5.12, and 5.19 for user namespaces (overlays of
// idmapped layers). Where the kernel gives a feature in more than one way, New probes each
// once on scratch mounts and takes the best one that works (mechanisms_linux.go): overlay
// layers as descriptors (6.13) or by /proc/self/fd path, the host files' tmpfs idmapped (6.3)
// or chowned to the sandbox root's host id. Running bothyd itself without root (rootless) is not implemented.
package namespace
