package store

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
)

func TestRecordsRoundTrip(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)

	c := config("a")
	c.Env = map[string]string{"K": "V"}
	c.Template = &TemplateRef{Template: "py", Generation: "g1"}
	if err := l.WriteConfig(c); err != nil {
		t.Fatal(err)
	}
	gotC, err := l.Config()
	c.Format = ConfigFormat
	if err != nil || !reflect.DeepEqual(gotC, c) {
		t.Fatalf("Config() = %+v, %v; want %+v", gotC, err, c)
	}
	if u, err := s.ReadConfigUnlocked("a"); err != nil || !reflect.DeepEqual(u, c) {
		t.Fatalf("ReadConfigUnlocked = %+v, %v", u, err)
	}

	j := &LaunchJournal{LaunchID: "l1", RuntimeID: "ns/1", StartedAt: at, Pid: 42, PidStartTime: 7, BootID: "b"}
	if err := l.WriteLaunchJournal(j); err != nil {
		t.Fatal(err)
	}
	j.Format = LaunchFormat
	if got, err := l.LaunchJournal(); err != nil || !reflect.DeepEqual(got, j) {
		t.Fatalf("LaunchJournal() = %+v, %v", got, err)
	}
	if got, err := s.ReadLaunchJournalUnlocked("a"); err != nil || !reflect.DeepEqual(got, j) {
		t.Fatalf("ReadLaunchJournalUnlocked = %+v, %v", got, err)
	}

	r := &RuntimeRecord{LaunchID: "l1", RuntimeKind: "namespace", RuntimeID: "ns/1", Pid: 42, PidStartTime: 7, BootID: "b", ControlSocket: "control/control.sock", StartedAt: at}
	if err := l.WriteRuntimeRecord(r); err != nil {
		t.Fatal(err)
	}
	r.Format = RuntimeFormat
	if got, err := l.RuntimeRecord(); err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("RuntimeRecord() = %+v, %v", got, err)
	}
	if got, err := s.ReadRuntimeRecordUnlocked("a"); err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("ReadRuntimeRecordUnlocked = %+v, %v", got, err)
	}

	o := &runtime.Outcome{LaunchID: "l1", ExitCode: 137, Signal: "KILL", OOMKilled: true, Reason: runtime.ReasonOOM, At: at}
	if err := runtime.WriteOutcome(l.Dir(), o); err != nil {
		t.Fatal(err)
	}
	o.Format = runtime.OutcomeFormat
	if got, err := l.Outcome(); err != nil || !reflect.DeepEqual(got, o) {
		t.Fatalf("Outcome() = %+v, %v", got, err)
	}
	if got, err := s.ReadOutcomeUnlocked("a"); err != nil || !reflect.DeepEqual(got, o) {
		t.Fatalf("ReadOutcomeUnlocked = %+v, %v", got, err)
	}

	// snake_case, "format" first, mode 0600, no temp leftovers.
	for name, keys := range map[string][]string{
		ConfigName:  {`"memory_mb"`, `"created_at"`, `"generation"`},
		LaunchName:  {`"launch_id"`, `"pid_start_time"`, `"boot_id"`},
		RuntimeName: {`"runtime_kind"`, `"control_socket"`, `"started_at"`},
		OutcomeName: {`"exit_code"`, `"oom_killed"`, `"reason"`},
	} {
		data, err := os.ReadFile(filepath.Join(l.Dir(), name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(data, []byte("{\n  \"format\": 1,")) {
			t.Errorf("%s does not start with its format: %.40s", name, data)
		}
		for _, k := range keys {
			if !bytes.Contains(data, []byte(k)) {
				t.Errorf("%s lacks %s", name, k)
			}
		}
		if fi, err := os.Stat(filepath.Join(l.Dir(), name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, %v; want 0600", name, fi.Mode(), err)
		}
	}
	for _, e := range entriesOf(t, l.Dir()) {
		if strings.HasSuffix(e, ".tmp") {
			t.Errorf("temp file %s left", e)
		}
	}

	for _, rm := range []func() error{l.RemoveLaunchJournal, l.RemoveRuntimeRecord, l.RemoveOutcome} {
		if err := rm(); err != nil {
			t.Fatal(err)
		}
		if err := rm(); err != nil {
			t.Fatalf("removing an absent record = %v; want nil", err)
		}
	}
	if got, err := l.LaunchJournal(); got != nil || err != nil {
		t.Fatalf("LaunchJournal() after removal = %v, %v; want nil, nil", got, err)
	}
	if got, err := l.RuntimeRecord(); got != nil || err != nil {
		t.Fatalf("RuntimeRecord() after removal = %v, %v; want nil, nil", got, err)
	}
	if got, err := l.Outcome(); got != nil || err != nil {
		t.Fatalf("Outcome() after removal = %v, %v; want nil, nil", got, err)
	}
	if got, err := s.ReadOutcomeUnlocked("a"); got != nil || err != nil {
		t.Fatalf("ReadOutcomeUnlocked after removal = %v, %v; want nil, nil", got, err)
	}
}

func TestConfigAbsent(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	l, err := s.LockForProvision(timeout(t, time.Second), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	_, err = l.Config()
	wantCode(t, err, errcode.SandboxNotFound)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Config() = %v; want it to wrap fs.ErrNotExist", err)
	}
	_, err = s.ReadConfigUnlocked("a")
	wantCode(t, err, errcode.SandboxNotFound)
	_, err = s.ReadConfigUnlocked("missing")
	wantCode(t, err, errcode.SandboxNotFound)
	_, err = s.ReadRuntimeRecordUnlocked("missing")
	wantCode(t, err, errcode.SandboxNotFound)
	if err := l.WriteConfig(config("b")); err == nil {
		t.Fatal("WriteConfig accepted a record of another sandbox")
	}
}

func TestUnknownFormatRefused(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	read := map[string]func() error{
		ConfigName:  func() error { _, err := l.Config(); return err },
		LaunchName:  func() error { _, err := l.LaunchJournal(); return err },
		RuntimeName: func() error { _, err := l.RuntimeRecord(); return err },
		OutcomeName: func() error { _, err := l.Outcome(); return err },
	}
	for name, fn := range read {
		for content, format := range map[string]int{`{"format": 7, "id": "a"}`: 7, `{"id": "a"}`: 0, `{"format": 2}`: 2} {
			if err := os.WriteFile(filepath.Join(l.Dir(), name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			err := fn()
			var fe *record.FormatError
			if !errors.As(err, &fe) || fe.Format != format || fe.Record != name {
				t.Fatalf("%s with %s: %v; want a FormatError for format %d", name, content, err, format)
			}
			if want := "format " + string(rune('0'+format)); !strings.Contains(err.Error(), want) {
				t.Fatalf("%s: message %q does not name %q", name, err, want)
			}
		}
	}
	_, err := s.ReadConfigUnlocked("a")
	var fe *record.FormatError
	if !errors.As(err, &fe) {
		t.Fatalf("ReadConfigUnlocked = %v; want a FormatError", err)
	}
}

func TestRecordTooLargeOrInvalid(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	big := append([]byte(`{"format":1,"launch_id":"`), bytes.Repeat([]byte("x"), MaxRecordSize)...)
	if err := os.WriteFile(filepath.Join(l.Dir(), LaunchName), big, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LaunchJournal(); !errors.Is(err, platform.ErrTooLarge) {
		t.Fatalf("oversized journal = %v; want ErrTooLarge", err)
	}
	if err := os.WriteFile(filepath.Join(l.Dir(), LaunchName), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LaunchJournal(); err == nil {
		t.Fatal("a truncated journal was accepted")
	}
}

func TestRecordNotRegularFailsAtOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range specialKinds {
		for _, name := range recordNames {
			t.Run(kind+"/"+name, func(t *testing.T) {
				t.Parallel()
				s := newStore(t)
				provision(t, s, "a")
				l := lockExisting(t, s, "a")
				path := filepath.Join(l.Dir(), name)
				os.Remove(path)
				check := makeSpecial(t, kind, path)
				read := map[string]func() error{
					ConfigName:  func() error { _, err := l.Config(); return err },
					LaunchName:  func() error { _, err := l.LaunchJournal(); return err },
					RuntimeName: func() error { _, err := l.RuntimeRecord(); return err },
					OutcomeName: func() error { _, err := l.Outcome(); return err },
				}[name]
				// A blocking open of the FIFO would hang here; a followed link would read the
				// valid record at its target.
				if err := read(); !errors.Is(err, platform.ErrNotRegular) {
					t.Fatalf("read = %v; want ErrNotRegular", err)
				}
				write := map[string]func() error{
					ConfigName:  func() error { return l.WriteConfig(config("a")) },
					LaunchName:  func() error { return l.WriteLaunchJournal(&LaunchJournal{}) },
					RuntimeName: func() error { return l.WriteRuntimeRecord(&RuntimeRecord{}) },
					OutcomeName: func() error { return runtime.WriteOutcome(l.Dir(), &runtime.Outcome{}) },
				}[name]
				if err := write(); !errors.Is(err, platform.ErrNotRegular) {
					t.Fatalf("write = %v; want ErrNotRegular", err)
				}
				unlocked := map[string]func() error{
					ConfigName:  func() error { _, err := s.ReadConfigUnlocked("a"); return err },
					LaunchName:  func() error { _, err := s.ReadLaunchJournalUnlocked("a"); return err },
					RuntimeName: func() error { _, err := s.ReadRuntimeRecordUnlocked("a"); return err },
					OutcomeName: func() error { _, err := s.ReadOutcomeUnlocked("a"); return err },
				}[name]
				if err := unlocked(); !errors.Is(err, platform.ErrNotRegular) {
					t.Fatalf("unlocked read = %v; want ErrNotRegular", err)
				}
				check()
				for _, e := range entriesOf(t, l.Dir()) {
					if strings.HasSuffix(e, ".tmp") {
						t.Errorf("temp file %s left", e)
					}
				}
			})
		}
	}
}

func TestCleanStaging(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	staged := []string{platform.TempName(OutcomeName), platform.TempName(OutcomeName)}
	kept := []string{
		platform.TempName(ConfigName),        // not a staging file: written under the lock
		platform.TempName("clone.json"),      // another component's
		".outcome.json.tmp",                  // not the store's exact form
		".outcome.json.0123456789ABCDEF.tmp", // not the store's exact form
		"outcome.json.0123456789abcdef.tmp",  // not the store's exact form
	}
	for _, name := range append(append([]string{}, staged...), kept...) {
		if err := os.WriteFile(filepath.Join(l.Dir(), name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.CleanStaging(); err != nil {
		t.Fatal(err)
	}
	for _, name := range staged {
		if exists(filepath.Join(l.Dir(), name)) {
			t.Errorf("staging leftover %s kept", name)
		}
	}
	for _, name := range kept {
		if !exists(filepath.Join(l.Dir(), name)) {
			t.Errorf("%s removed; it is not an outcome staging file", name)
		}
	}
}

// Resources show in messages (template-ineligible) as the API names them, not as a Go struct.
func TestResourcesString(t *testing.T) {
	t.Parallel()
	r := Resources{VCPUs: 1, MemoryMB: 512, Pids: 512}
	const want = "vcpus=1 memory_mb=512 pids=512"
	for _, got := range []string{r.String(), fmt.Sprintf("%v", r), fmt.Sprintf("%+v", r)} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}
