// Package supervisor drives sandboxes through their lifecycle: provision, launch, reattach,
// stop, deprovision, and the admission of exec sessions. It owns the runtime (a
// runtime.Runtime) and the control sessions with the agents inside sandboxes, and keeps the
// store's records in step with the processes they describe.
//
// It knows nothing of HTTP: callers pass contexts whose deadlines bound every wait, and get
// typed errors (errcode) back.
//
// # Launch
//
// Under the sandbox's lifecycle lock: write the per-launch capability (control.capability,
// created exclusively, 0600) and the launch journal (durably), start the runtime process,
// rewrite the journal with the process's identity, wait until the agent answers hello on the
// control socket, then commit: write the runtime record and remove the journal. If the agent
// does not answer by the deadline, the process is killed, its leftovers are cleaned up, the
// journal is removed, and the caller gets start-timeout with the tail of sandbox.log.
//
// # Reattach
//
// Every transition but provision starts by reconciling the records with the processes
// (reattach): a journal without a runtime record is an interrupted start, whose process (found
// by the identity in the journal, or by the runtime's marker when the crash came before the
// journal named it) is killed and whose launch is abandoned; a runtime record whose process is
// alive is held; one whose process is gone is cleared, so the sandbox reads as stopped; a live
// process of another runtime identity is running, flagged [Status.RuntimeMismatch], and never
// driven (runtime-mismatch), except by a forced stop. sandboxd reattaches every sandbox at
// start-up.
//
// # Exec admission
//
// One exec runs at a time per sandbox. An exec takes exec.lock (a non-blocking flock tried
// under the lifecycle lock, after checking that the sandbox is running) and holds it until its
// workload ends. While another exec holds it, admission retries every 25 ms until the caller's
// wait has passed, then fails with sandbox-busy. Stop takes no exec lock: it proceeds while a
// workload runs, and the workload ends with the sandbox.
package supervisor
