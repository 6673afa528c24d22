// Package check is bothyd's consistency checker: it verifies a state root offline or beside
// a running server, and with repair fixes what is safe to fix. cmd/bothyd serves it as
// `bothyd check`.
//
// It reads the sandbox store, the runtime's processes and host resources, the host's mounts,
// and the template store, through their exported functions and the runtime.Runtime interface
// (cmd/bothyd gives it the runtime the server uses, configured as the server configures
// it); it keeps no rules of its own about what a state directory holds beyond what those
// packages declare (store.OwnNames, supervisor.DeclaredEntries), and knows no concrete
// runtime. It must never delete a sandbox,
// a template generation or user data, and never signal a process whose identity it has not
// verified.
//
// # What is checked
//
//   - The sandboxes directory holds only state directories named by valid ids.
//   - Each state directory is a directory (not a link), owned by bothyd's user, mode 0700,
//     holding only the store's entries, the names declared to the store (by the supervisor
//     and its runtime), the store's temp names and NFS's ".nfs*" names; records and declared
//     files are regular files, declared directories are directories; config.json reads and
//     names its directory. A directory without config.json is left over.
//   - Every runtime record names a live process (pid, start time, boot id), or it is stale,
//     and that process is the one the runtime knows as that directory's shim
//     (Runtime.Processes), or it is unmarked. A live process of another runtime identity is
//     noted (runtime-mismatch), not a problem.
//   - A launch journal without a runtime record of its launch is an interrupted start; one
//     beside the record of its own launch is a journal whose removal was interrupted, or
//     undone by a crash of the host (that removal is not synced).
//   - Every runtime process (shim or init) that the runtime finds under the state root (by
//     facts a sandbox cannot forge, not by the marker in argv alone) is named by a runtime
//     record (a shim by its identity, an init as the child of the recorded shim).
//   - No host mount lies below the state root (the runtime mounts only inside sandboxes'
//     own mount namespaces), and no sandbox cgroup exists for a sandbox of this root that is
//     not running, nor a file that only a running launch needs (Runtime.HostResources: a
//     microVM's control socket). A runtime's processes include what outlived its runtime
//     process (a microVM's QEMU whose shim is gone), which no record names.
//   - A runtime that keeps files shared by its sandboxes in the host base directory
//     (runtime.SharedFiles: a microVM's initramfs and base disks) says which of them nothing
//     needs: half-made builds, an older guest stack's initramfs, base disks that no disk
//     (a sandbox's overlay, a template generation's frozen disk) backs onto; those it cannot
//     be sure of are notes.
//   - Every clone binding names a lease record that exists, and the template store's own
//     check passes: every lease record is matched by a clone binding, no generation payload
//     lacks its index entry or the reverse, no retirement or capture was left half done.
//     The template store's outbox of tombstones for the template registry is noted
//     (template-tombstone-pending), not a problem: the server pushes it.
//   - The webhooks' records (package webhook, <root>/webhooks): every record and outbox
//     entry reads, no temporary file or outbox of a deleted webhook is left; beside a running
//     server, which holds their lock, they are only read (a note says so).
//   - The volumes (package volume, through cmd/bothyd, docs/volumes.md): half-made volumes,
//     unfinished deletes, records without their image, ready volumes not mounted, stale
//     holds, and host mounts and loop devices below <root>/volumes that no ready volume has
//     (which the host mounts' and loop devices' own checks leave to it). Repair fixes each
//     under the volume store's lock, but a leftover loop device, which clears itself once
//     the mount that holds it goes.
//   - The kept answers of idempotent creates (package idempotency): every record reads; an
//     expired record or an old temporary file is a leftover.
//   - A sandbox's checkpoints (package checkpoint): no operation left pending by a crash, no
//     staging or thrown-away leftovers, no layer that a chain names missing. Repair's
//     reattach finishes or undoes the interrupted operation and sweeps the leftovers.
//   - The store's trash (store.TrashDir) is counted: bins of deleted sandboxes' entries
//     that nothing freed yet are a note (trash), not a problem, since a running server frees
//     them right after each delete.
//
// # Beside a running server
//
// The checker reads records without the lifecycle lock, as the server's list does, but first
// tries the sandbox's lock once without waiting, and holds it while it looks: a sandbox whose
// lock another process holds is in a transition, and its records are noted, not judged.
// Processes are listed before any directory is looked at and judged after, so that a launch
// that commits meanwhile is seen with its record, and one that was abandoned is seen dead.
//
// # Repair
//
// Repair takes each sandbox's lifecycle lock (so it is safe beside a running server) and runs
// the supervisor's own start-up reconciliation (Supervisor.ReattachAll): interrupted starts
// are ended, stale records cleared. It then kills, under the sandbox's lock and by verified
// identity, runtime processes that no record names; releases the cgroups, launch files and
// mounts of sandboxes that are not running (Runtime.Cleanup); takes the lock of left-over
// directories without config.json once, which lets the store remove them; has each runtime
// remove its stale shared files (looking again that no process took one up); empties the
// store's trash; runs the template store's check with repair, then, given
// Options.FlushTemplateOutbox, pushes its outbox to the template registry; and, when no server holds their
// lock, removes the webhooks' leftovers, and the kept answers' leftovers. It never removes a sandbox, a foreign entry or a record it
// cannot read.
// The state root is then checked again, and a problem is reported as repaired when the second
// pass no longer finds it.
//
// # Cgroups of other state roots
//
// The runtime lists the cgroups of this root's sandboxes (Runtime.HostResources): the
// namespace runtime names one <parent>/<id>.<hash of its state directory>, so the cgroups of
// other state roots on the same host are told apart and never reported, and a cgroup of this
// root whose sandbox is gone is.
package check
