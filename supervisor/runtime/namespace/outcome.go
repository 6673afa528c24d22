package namespace

import (
	"encoding/json"
	"time"

	"github.com/sandboxd/sandboxd/platform"
)

// Outcome reasons.
const (
	ReasonExited      = "exited"       // the init exited with ExitCode
	ReasonSignaled    = "signaled"     // the init was killed by Signal
	ReasonOOM         = "oom-killed"   // the kernel's OOM killer killed in the sandbox's cgroup
	ReasonStartFailed = "start-failed" // the sandbox could not be set up
)

// Outcome is how a sandbox's run ended.
//
// SEAM: this mirrors store.Outcome, which the store is defining now; once store.WriteOutcome
// lands, writeOutcome calls it and this type goes.
type Outcome struct {
	Format    int       `json:"format"`
	LaunchID  string    `json:"launch_id"`
	ExitCode  int       `json:"exit_code"`
	Signal    int       `json:"signal,omitempty"`
	OOMKilled bool      `json:"oom_killed,omitempty"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
}

// writeOutcome writes the outcome report of dir durably.
func writeOutcome(dir string, o *Outcome) error {
	o.Format = 1
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(dir, OutcomeName, append(b, '\n'), 0o600)
}
