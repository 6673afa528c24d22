package namespace

import (
	"github.com/sandboxd/sandboxd/store"
)

// Outcome is how a sandbox's run ended: the store's outcome record, which the shim writes
// when the sandbox ends. Signal is a name such as "SIGKILL"; ExitCode is -1 when a signal
// ended the init.
type Outcome = store.Outcome

// writeOutcome writes the outcome report of dir durably.
func writeOutcome(dir string, o *Outcome) error { return store.WriteOutcome(dir, o) }
