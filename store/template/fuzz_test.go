package template

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/record"
)

// FuzzDecodeRecords feeds arbitrary bytes to every record decoder: none may panic, every
// refusal is a typed internal error, a record with a format other than the current one is
// always refused naming that format, and an accepted record names only valid ids and encodes
// and decodes again to the same record.
func FuzzDecodeRecords(f *testing.F) {
	seeds := []string{
		`{"format":1,"name":"py","uid":"00","created_at":"2026-01-01T00:00:00Z","next_generation":3}`,
		`{"format":1,"id":"g000001","template":"py","key":{"runtime":"r","image":"host","resources":{"vcpus":1,"memory_mb":2,"pids":3}},"time":{"host_id":"h","boot_id":"b","clock":"boottime","monotonic_ns":5,"utc":"2026-01-01T00:00:00Z"},"captured_at":"2026-01-01T00:00:00Z","size_bytes":9}`,
		`{"format":1,"at":"2026-01-01T00:00:00Z","drain":true}`,
		`{"format":1,"id":"l-0123456789abcdef","template":"py","generation":"g000001","sandbox":"a","acquired_at":"2026-01-01T00:00:00Z"}`,
		`{"format":1,"template":"py","generation":"g000001","lease":"l-0123456789abcdef","acquired_at":"2026-01-01T00:00:00Z"}`,
		`{"format":2}`, `{}`, `[]`, `null`, `{"format":"1"}`,
		`{"format":1,"id":"../../etc","template":"py","generation":"g1","sandbox":"A"}`,
	}
	for i, s := range seeds {
		for k := range 5 {
			_ = i
			f.Add(uint8(k), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		var (
			err error
			v   any
			re  func([]byte) (any, error)
		)
		switch kind % 5 {
		case 0:
			re = func(b []byte) (any, error) { return decodeTemplate(b) }
		case 1:
			re = func(b []byte) (any, error) { return decodeIndex(b) }
		case 2:
			re = func(b []byte) (any, error) { return decodeTombstone(b) }
		case 3:
			re = func(b []byte) (any, error) { return decodeLease(b) }
		case 4:
			re = func(b []byte) (any, error) { return DecodeBinding(b) }
		}
		v, err = re(data)
		if err != nil {
			if errcode.Of(err) != errcode.Internal {
				t.Fatalf("refusal %v is not an internal error", err)
			}
			var fe *record.FormatError
			if errors.As(err, &fe) && fe.Format == 1 {
				t.Fatalf("format 1 refused as unknown: %v", err)
			}
			return
		}
		switch r := v.(type) {
		case *templateRecord:
			if r.Format != TemplateFormat || !naming.ValidID(r.Name) {
				t.Fatalf("accepted %+v", r)
			}
		case *indexEntry:
			if r.Format != IndexFormat || ValidateGeneration(r.ID) != nil || !naming.ValidID(r.Template) {
				t.Fatalf("accepted %+v", r)
			}
		case *leaseRecord:
			if r.Format != LeaseFormat || !validLeaseID(r.ID) || !naming.ValidID(r.Sandbox) || ValidateGeneration(r.Generation) != nil {
				t.Fatalf("accepted %+v", r)
			}
		case *Binding:
			if r.Format != BindingFormat || !validLeaseID(r.Lease) || ValidateGeneration(r.Generation) != nil {
				t.Fatalf("accepted %+v", r)
			}
		}
		enc, err := record.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		v2, err := re(enc)
		if err != nil {
			t.Fatalf("a re-encoded record does not decode: %v", err)
		}
		enc2, _ := record.Encode(v2)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the record:\n%s\n%s", enc, enc2)
		}
	})
}
