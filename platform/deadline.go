package platform

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Instant is one reading of the clocks a [Deadline] is judged by: the wall clock in UTC, and
// CLOCK_BOOTTIME with the boot it belongs to. A reading of CLOCK_BOOTTIME means nothing under
// another boot id.
type Instant struct {
	UTC      time.Time
	BootID   string
	Boottime time.Duration
}

// Now reads the clocks. Where CLOCK_BOOTTIME or the boot id cannot be read (not Linux), the
// instant has the wall clock alone, and deadlines set or judged with it fall back to UTC.
func Now() Instant {
	now := Instant{UTC: time.Now().UTC()}
	boot, err := BootID()
	if err != nil {
		return now
	}
	bt, err := Boottime()
	if err != nil {
		return now
	}
	now.BootID, now.Boottime = boot, bt
	return now
}

// Deadline is a point in time that survives a restart of bothyd and a jump of the wall
// clock. It keeps the deadline twice: as UTC, and as the CLOCK_BOOTTIME reading at which it
// falls, with the boot id that reading belongs to. On the boot that set it, it is judged by
// CLOCK_BOOTTIME alone, which no one can set, so a wall clock set forward does not expire it
// early and one set back does not keep it forever; after a reboot (another boot id) only the
// wall clock is left, and it is judged by UTC. The zero Deadline is none: it never expires.
//
// Its JSON form ([Deadline.MarshalJSON]) is the one to store in a record:
// {"utc": RFC 3339, "boot_id": ..., "boottime_ns": ...}.
type Deadline struct {
	UTC      time.Time
	BootID   string
	Boottime time.Duration
}

// DeadlineAfter is the deadline d after now.
func DeadlineAfter(now Instant, d time.Duration) Deadline {
	dl := Deadline{UTC: now.UTC.Add(d).UTC()}
	if now.BootID != "" {
		dl.BootID, dl.Boottime = now.BootID, now.Boottime+d
	}
	return dl
}

// IsZero reports whether there is no deadline.
func (dl Deadline) IsZero() bool { return dl.UTC.IsZero() && dl.BootID == "" }

// Remaining is how long from now until the deadline (negative once it has passed), by
// CLOCK_BOOTTIME on the boot that set it and by UTC on any other.
func (dl Deadline) Remaining(now Instant) time.Duration {
	if dl.BootID != "" && dl.BootID == now.BootID {
		return dl.Boottime - now.Boottime
	}
	return dl.UTC.Sub(now.UTC)
}

// Expired reports whether the deadline has passed at now; the zero Deadline never does.
func (dl Deadline) Expired(now Instant) bool {
	return !dl.IsZero() && dl.Remaining(now) <= 0
}

type deadlineJSON struct {
	UTC      time.Time `json:"utc"`
	BootID   string    `json:"boot_id,omitempty"`
	Boottime int64     `json:"boottime_ns,omitempty"`
}

// MarshalJSON encodes the deadline for a record.
func (dl Deadline) MarshalJSON() ([]byte, error) {
	return json.Marshal(deadlineJSON{UTC: dl.UTC.UTC(), BootID: dl.BootID, Boottime: int64(dl.Boottime)})
}

// UnmarshalJSON decodes a deadline, refusing one that cannot be judged: a boot id without a
// boottime reading or the reverse, a negative reading, or no UTC at all.
func (dl *Deadline) UnmarshalJSON(b []byte) error {
	var j deadlineJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	switch {
	case (j.BootID == "") != (j.Boottime == 0):
		return errors.New("platform: a deadline needs both its boot id and its boottime reading, or neither")
	case j.Boottime < 0:
		return fmt.Errorf("platform: a deadline's boottime reading %d is negative", j.Boottime)
	case j.UTC.IsZero() && j.BootID != "":
		return errors.New("platform: a deadline lacks its UTC time, which a reboot needs")
	}
	*dl = Deadline{UTC: j.UTC.UTC(), BootID: j.BootID, Boottime: time.Duration(j.Boottime)}
	return nil
}
