package store

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
)

// FuzzDecodeRecords feeds arbitrary bytes to the decoder of every record the store reads from
// disk: it never panics, refuses every format but its own (with a FormatError), and what it
// accepts survives a round trip through the encoder.
func FuzzDecodeRecords(f *testing.F) {
	for _, seed := range []string{
		`{"format":1,"id":"a1","image":"host","resources":{"vcpus":1,"memory_mb":512,"pids":512},"created_at":"2026-01-01T00:00:00Z"}`,
		`{"format":1,"launch_id":"x","pid":12,"pid_start_time":99,"boot_id":"b"}`,
		`{"format":1,"launch_id":"x","exit_code":-1,"signal":"SIGKILL","reason":"signaled","at":"2026-01-01T00:00:00Z"}`,
		`{"format":2}`, `{"format":null}`, `{}`, `[]`, `{"format":1,"env":{"A":"B"},"labels":{"k":"v"}}`,
		`{"format":1,"template":{"template":"t","generation":"g000001"}}`, `{"format":"1"}`, `{"format":1,"env":{},"labels":{}}`,
	} {
		f.Add([]byte(seed))
	}
	kinds := []struct {
		name   string
		format int
		new    func() any
	}{
		{ConfigName, ConfigFormat, func() any { return &Config{} }},
		{LaunchName, LaunchFormat, func() any { return &LaunchJournal{} }},
		{RuntimeName, RuntimeFormat, func() any { return &RuntimeRecord{} }},
		{OutcomeName, runtime.OutcomeFormat, func() any { return &runtime.Outcome{} }},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, k := range kinds {
			v := k.new()
			err := record.Decode(k.name, data, k.format, v)
			var fe *record.FormatError
			if errors.As(err, &fe) && fe.Format == k.format {
				t.Fatalf("%s: refused its own format %d", k.name, k.format)
			}
			if err != nil {
				continue
			}
			b, err := record.Encode(v)
			if err != nil {
				t.Fatalf("%s: accepted %q but cannot encode it: %v", k.name, data, err)
			}
			again := k.new()
			if err := record.Decode(k.name, b, k.format, again); err != nil {
				// The decoder accepted a record whose own format field it ignored (a
				// mismatched field type); the re-encoding must at least carry the format.
				if errors.As(err, &fe) {
					continue
				}
				t.Fatalf("%s: the re-encoding of %q does not decode: %v", k.name, data, err)
			}
			// Compare encodings: an empty map and an absent one encode alike (omitempty).
			if b2, _ := record.Encode(again); !bytes.Equal(b, b2) {
				t.Fatalf("%s: round trip changed %s into %s", k.name, b, b2)
			}
		}
	})
}
