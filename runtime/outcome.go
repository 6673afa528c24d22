package runtime

import (
	"io/fs"
	"os"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// OutcomeName is the outcome report in a state directory, and OutcomeFormat its record format.
const (
	OutcomeName   = "outcome.json"
	OutcomeFormat = 1
)

// Reason says why a sandbox's run ended.
type Reason string

// The reasons an Outcome gives.
const (
	ReasonExited      Reason = "exited"       // the init exited by itself
	ReasonSignaled    Reason = "signaled"     // a signal ended the init
	ReasonOOM         Reason = "oom"          // the kernel's OOM killer ended it
	ReasonStopped     Reason = "stopped"      // a stop of the supervisor's ended it
	ReasonStartFailed Reason = "start-failed" // it never became ready
)

// Outcome is outcome.json: how the sandbox's last run ended. The runtime process writes it
// when the sandbox ends ([WriteOutcome]), without the sandbox's lifecycle lock, since it may
// end while a transition holds it; the supervisor writes it for a launch it abandons or
// stops; the store reads it under the lock. Signal is a name such as "SIGKILL"; ExitCode is
// -1 when a signal ended the init.
type Outcome struct {
	Format    int       `json:"format"`
	LaunchID  string    `json:"launch_id"`
	ExitCode  int       `json:"exit_code"`
	Signal    string    `json:"signal,omitempty"`
	OOMKilled bool      `json:"oom_killed"`
	Reason    Reason    `json:"reason"`
	At        time.Time `json:"at"`
}

// WriteOutcome writes the outcome report into the state directory dir, stamped with
// OutcomeFormat. It stages the report under platform's temp form
// (".outcome.json.<random>.tmp"), fsyncs it, renames it to outcome.json and fsyncs dir, so a
// reader sees a whole report or none. A staging file left by a crash is removed by the store
// (Lock.CleanStaging, or removal) once no process of that launch can run.
func WriteOutcome(dir string, o *Outcome) error {
	return writeOutcome(dir, o, platform.WriteFileDurableAt)
}

// AmendOutcome replaces the outcome report in dir with o as WriteOutcome does, but without
// the directory's fsync ([platform.WriteFileWholeAt]): after a crash of the host the report
// reads as o or as the one it replaced, whole. It is for the supervisor's amendment of a
// report that the runtime process wrote durably (that the sandbox ended on request), which
// the next durable change of dir makes durable too.
func AmendOutcome(dir string, o *Outcome) error {
	return writeOutcome(dir, o, platform.WriteFileWholeAt)
}

func writeOutcome(dir string, o *Outcome, write func(*os.File, string, []byte, fs.FileMode) error) error {
	rec := *o
	rec.Format = OutcomeFormat
	data, err := record.Encode(&rec)
	if err != nil {
		return err
	}
	d, err := platform.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return write(d, OutcomeName, data, record.Perm)
}
