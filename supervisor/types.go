package supervisor

import (
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// The supervisor's callers (the HTTP handlers) see sandboxes, runs and templates through the
// names below, so that they depend on the supervisor alone and not on the stores or the
// runtime behind it. The records keep one definition each, in the package that writes them:
// these are aliases, not copies to keep in step.

// Config is a sandbox's configuration record.
type Config = store.Config

// Resources are a sandbox's resource limits.
type Resources = store.Resources

// SleepPolicy is when a sandbox sleeps when idle and whether use wakes it.
type SleepPolicy = store.SleepPolicy

// VolumeMount is a volume a sandbox mounts: its name, where inside, read-only or not.
type VolumeMount = store.VolumeMount

// Exit is how a sandbox's run ended: the runtime's outcome report.
type Exit = runtime.Outcome

// ExitReason says why a run ended.
type ExitReason = runtime.Reason

// The reasons an [Exit] gives.
const (
	ReasonExited      = runtime.ReasonExited      // the sandbox's init exited by itself
	ReasonSignaled    = runtime.ReasonSignaled    // a signal ended it
	ReasonOOM         = runtime.ReasonOOM         // the kernel's OOM killer ended it
	ReasonStopped     = runtime.ReasonStopped     // a stop ended it
	ReasonStartFailed = runtime.ReasonStartFailed // it never became ready
	// ReasonKilled: a forced stop ended it. The supervisor writes it over the runtime's own
	// report, as it writes ReasonStopped for a graceful stop; no runtime reports it.
	ReasonKilled runtime.Reason = "killed"
)

// Template is the view of one template.
type Template = template.Template

// Generation is the view of one template generation.
type Generation = template.Generation

// Lease is the view of one lease on a generation.
type Lease = template.Lease

// Binding is a clone's template binding: the lease it holds on its generation.
type Binding = template.Binding

// RetireOutcome is how a retirement (of a generation, or a template's delete) ended.
type RetireOutcome = template.Outcome

// The outcomes of [Supervisor.Retire] and [Supervisor.DeleteTemplate].
const (
	// Retired: the generation (or template) is gone.
	Retired = template.Retired
	// Draining: leases remain; the retirement finishes when the last one goes.
	Draining = template.Draining
)
