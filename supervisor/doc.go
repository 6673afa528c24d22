// Package supervisor drives sandboxes through their lifecycle: provision, launch, reattach,
// stop, deprovision, the admission of exec sessions, and the capture and cloning of template
// generations. It owns a [runtime.Runtime] (and knows no concrete runtime) and the control
// sessions with the agents inside sandboxes, and keeps the store's records in step with the
// processes they describe. docs/design.md says how it fits with the stores and the runtime.
//
// It knows nothing of HTTP: callers pass contexts whose deadlines bound every wait, and get
// typed errors ([errcode.Error]) back. Its callers see sandboxes and templates through it
// alone. Several supervisors, in several processes, may share a state root: the store's locks
// serialise them.
//
// # Launch
//
// Under the sandbox's lifecycle lock, after reattach ([Supervisor.Start]): write the
// per-launch capability (control.capability, 0600, atomically) and the launch journal
// (atomically, its content synced), start the runtime process, rewrite the journal with the
// process's identity, wait until the agent answers hello on the control socket, then commit:
// write the runtime record (durably) and remove the journal (without a sync). Only the
// runtime record must survive a crash of the host: the capability and the journal speak of
// processes that such a crash ends, and a journal it brings back beside its launch's runtime
// record is removed by the next reattach. If the agent does not answer by the deadline, or the runtime process exits
// first, the launch is abandoned on a context of its own: the process is killed by verified
// identity, its leftovers are cleaned up, an outcome start-failed is written, the journal is
// removed, and the caller gets start-timeout with the tail of sandbox.log. Tests kill a launch
// at each of its crash points: journaled, spawned, named, recorded.
//
// # Reattach
//
// Every transition but provision starts by reconciling the records with the processes
// (reattach): a journal without a runtime record of its launch is an interrupted start, whose
// process (found by the identity in the journal, or among the runtime's processes when the
// crash came before the journal named it) is killed and whose launch is abandoned; a runtime
// record whose process is alive is held; one whose process is gone is cleared, so the sandbox
// reads as stopped; a live process of another runtime identity is running, flagged
// [Status.RuntimeMismatch], and never driven (runtime-mismatch), except by a forced stop.
// bothyd reattaches every sandbox at start-up ([Supervisor.StartReattach]), in a pass that runs
// while it serves; an operation that locks a sandbox the pass has not reached reconciles it
// first. A committed launch
// is also watched through a pidfd, and the sandbox is reconciled as soon as its runtime process
// exits.
//
// # Spares
//
// With [Options.Spares], the supervisor keeps sandboxes started ahead with the server's
// defaults ([Supervisor.StartSpares]); a create with start that names nothing but labels and a
// lifetime ([CreateRequest.AnyID]) claims one by rewriting its configuration record without
// the spare mark. A marked sandbox is invisible to every caller; spares.go says how a crash,
// a restart and Close treat them.
//
// # Exec admission
//
// One exec runs at a time per sandbox. An exec ([Supervisor.AdmitExec]) takes exec.lock (a
// non-blocking flock tried under the lifecycle lock, after checking that the sandbox is
// running) and holds it until its workload ends ([Admission.Release]). While another exec
// holds it, admission retries every 25 ms until the caller's wait has passed, then fails with
// sandbox-busy. Stop takes no exec lock: it proceeds while a workload runs, and the workload
// ends with the sandbox. An exec admitted just before a stop, whose workload reaches the
// agent after the agent answered the stop's shutdown, is refused as not-running, as one
// admitted after the stop is.
//
// # Templates
//
// [Supervisor.Capture] copies a stopped sandbox's writable layer (merged over its
// generation's payload, for a clone) into a new generation while it holds the sandbox's
// lifecycle lock. [Supervisor.Clone] takes the template store's lock, then the new sandbox's
// lifecycle lock, and writes the configuration record, the lease and the clone binding in that
// order. [Supervisor.Deprovision] removes the binding under the sandbox's lock and releases
// the lease only after that lock is gone: the template store's lock is never taken inside a
// sandbox's.
package supervisor
