// Package store is the sandbox store: one state directory per sandbox under
// <root>/sandboxes/<id>, the lifecycle lock that serializes every transition of a sandbox
// across threads and processes, the sandbox's durable records, and the removal protocol.
//
// It knows nothing about HTTP, runtimes or templates: it hands out locks and records and
// returns typed errors ([errcode.Error]) that the server maps to statuses. docs/design.md
// says how the store fits with the supervisor and the template store. It must never
// follow a link or block on a FIFO inside a state directory, and it removes only entries it
// owns or that other components declared to it.
//
// # State directories
//
// A sandbox id is 1–63 characters of a-z, 0-9 and '-', starting with a letter or a digit; it
// is validated before it becomes part of any path. A state directory is created with mode
// 0700 and holds only named entries: the store's own (sandbox.lock, config.json, launch.json,
// runtime.json, outcome.json and the temp names of durable writes, ".<name>.<random>.tmp"),
// and the names other components declare with [Store.Declare] at start-up (exec.lock,
// clone.json, sandbox.log, the runtime's directories, ...). Declared names are checked when
// declared, before any directory is touched: one plain name of ASCII letters, digits, '.',
// '_' and '-' that, ignoring ASCII case, collides with no store name, no temp-name form, no
// ".nfs*" name and no other declared name. Anything else in a state directory is foreign.
//
// All access goes through directory handles: the store opens <root>/sandboxes once without
// following links, and reaches each state directory and each file in it by one plain name
// with *at system calls, with O_NOFOLLOW and O_NONBLOCK, checking with fstat that a record or
// lock is a regular file. A link, FIFO, socket or device where a record or lock should be is
// refused at once and left as it is.
//
// # Records
//
// config.json (presence means "provisioned"), launch.json (a launch in progress), runtime.json
// (a committed launch's live process) and outcome.json (how the last run ended) are JSON with
// a "format" number first; a record with a format this version does not know is refused with
// an error naming the format, never guessed at. Every write is atomic and durable: a temp
// file in the same directory, fsync, rename over the record, fsync of the directory (package
// [platform.WriteFileDurableAt]). Readers therefore see a whole record or none, which is why
// list and get may read records without the lock ([Store.ReadConfigUnlocked] and friends).
// Reads are bounded ([MaxRecordSize]).
//
// outcome.json is the exception to "written under the lock": the runtime's shim writes it
// with [runtime.WriteOutcome] when the sandbox ends, whatever transition holds the lock. Its
// staging leftovers are removed ([Lock.CleanStaging], removal) only when no process of that
// launch can still run.
//
// The store removes its own temp leftovers and only those, each when no write that could own
// one can be in flight: those of config.json, launch.json and runtime.json whenever a lock is
// taken (only holders write them), the outcome's by [Lock.CleanStaging], and at removal also
// those of declared files. A name merely resembling the temp form is foreign.
//
// # The lock protocol
//
// Every transition holds an exclusive flock(2) on <dir>/sandbox.lock for its whole duration.
// flock belongs to an open file description and dies with its process, so a crashed holder
// never wedges a sandbox, and two opens in one process exclude each other like two processes.
// A provision locks with [Store.LockForProvision], every other transition with
// [Store.LockExisting], and [Lock.Unlock] releases. One attempt, never blocking, is:
//
//  1. (provision only) mkdir the state directory, tolerating that it exists;
//  2. open the directory by name, without following a link; if it is missing a provision
//     starts over (a removal deleted it just after step 1), anything else fails with
//     sandbox-not-found; a provision refuses a directory that is not private (owner and 0700);
//  3. open (creating if missing) sandbox.lock in it, O_NOFOLLOW|O_NONBLOCK, regular only;
//  4. try flock(LOCK_EX|LOCK_NB); if another holds it, the attempt is "busy";
//  5. with the lock, check that the entry sandbox.lock is still the file we locked and that
//     the directory's name still names the directory we opened (device and inode). A removal
//     unlinks the lock file, and then the directory, while holding the lock: a waiter that had
//     opened the old file gets its lock only after it stopped being the lock, and this check
//     sends it back to step 1, where it finds the sandbox gone or (provision) makes it again;
//  6. remove the temp leftovers of records that only holders write;
//  7. (lock-existing only) without a configuration record the sandbox does not exist:
//     release as in Unlock below and fail with sandbox-not-found.
//
// Busy attempts are repeated every [RetryInterval] (25 ms) until the caller's deadline (the
// context's deadline, which must exist; a context without one is refused with
// invalid-request before anything waits); no attempt starts after the deadline, and the
// caller gets transition-in-progress. [Retry] is that rule, shared by every lock of bothyd.
// Attempts that lost a race with a removal (step 2 or 5) are repeated at once.
//
// Only a holder ever removes a lock file, so a holder's identity check followed by unlink
// cannot remove someone else's. A holder that leaves a directory without a configuration
// record (a failed provision, a lock-existing that found nothing, a removal that kept foreign
// files) removes its own lock file and then the directory if that left it empty, so no stale
// directory keeps a lock file. Removing an empty directory is harmless to everyone else:
// whoever had opened it to lock finds it gone at step 3 or 5 and starts over.
//
// # The removal protocol
//
// [Lock.Deprovision] runs under the lock:
//
//  1. it needs the configuration record (else sandbox-not-found), and refuses with
//     sandbox-launched while runtime.json or launch.json exists: stop first;
//  2. it moves the store's files, the declared files and directories (a declared directory
//     that is a mount point is refused) and the temp leftovers into a new bin of the trash,
//     <root>/trash/<id>.<random>, deleting in place (recursively, with unlinkat and
//     O_NOFOLLOW: a link is removed, never followed) what it cannot move, then config.json
//     last, durably: an interrupted removal leaves a provisioned sandbox that removing again
//     finishes, never a half-removed one that looks provisioned;
//  3. if foreign entries remain it reports foreign-files naming them and keeps the directory
//     and them (the sandbox itself is removed);
//  4. otherwise it removes its lock file while still holding the lock, then the directory.
//
// On a local file system that empties the directory. On NFS, a removed file that a waiter
// still holds open is renamed to ".nfs*" and keeps the directory non-empty; a waiter may also
// create a fresh lock file between steps 4's unlink and rmdir. Then the removal releases the
// lock and waits, up to its deadline, looking every 25 ms: it removes the directory once
// empty; it succeeds if the name is gone or names another directory (another removal
// finished, or the id was made again and removed); it reports provisioned-again and leaves the
// new sandbox alone if a configuration record appears in the directory (a provision took the
// lock meanwhile). A lock file left behind by a crashed waiter is taken once without waiting,
// which removes it. If the deadline passes first it reports transition-in-progress: the
// sandbox is gone, and its directory goes with its last user.
//
// # Faults
//
// A crash at any point is safe by the write order above; a failed write is made equally
// safe. Every error the store returns passes through [errcode.Storage]: ENOSPC and EDQUOT
// come back as storage-full, EROFS and EIO as storage-unavailable, naming the state root,
// with the errno still reachable by errors.Is. Every change on disk goes through the
// [platform.FS] of Options, so that tests fail any step of any transaction.
//
// A write that fails leaves what was there: the durable write removes its temp file, and a
// record that did not exist before (config.json of a provision, launch.json of a launch,
// runtime.json of a commit) is removed again when the failure came after its rename (the
// directory's fsync, or for config.json the sandboxes directory's): a provision that fails
// leaves the id free, and its lock attempt removes a state directory it made when it cannot
// make the lock file in it. When such an undo fails too (the file system went read-only),
// what stays is whole and reads as what it is: a provisioned sandbox that a delete removes,
// a journal that the next transition's reattach ends, an empty state directory or temp
// leftovers that the next lock (and bothyd check --repair, which takes it) removes.
//
// Removal needs no space: where making the bin or a move into it is refused it unlinks,
// removes directories and fsyncs in place (no marker is written first), so a delete works on
// a full disk, and that is how a user frees one. Reads and lists change nothing and work too.
//
// # The trash
//
// A move frees no block, so a removal answers without waiting for the file system to free
// the sandbox's disk image and layers (and, on a file system mounted with discard, to
// discard them). [Store.EmptyTrash] deletes the bins afterwards, with the same walk; a
// server's janitor calls it after each removal ([Store.Trashed]) and at start-up, and bothyd
// check --repair does. Everything in the trash is garbage, which is why no record says what
// is there: a crash leaves bins that the next call deletes.
package store
