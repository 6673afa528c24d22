// Package record is the one on-disk form of every record bothyd keeps: the sandbox store's
// (config.json, launch.json, runtime.json), the runtime's outcome report (outcome.json) and the
// template store's. A record is indented JSON with a "format" number; a reader refuses a format
// it does not know by name ([FormatError]), never guesses at it, and reads at most [MaxSize]
// bytes. It is a leaf: the stores and the runtime's shim, which must not import each other,
// share it.
package record

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/bothy/bothy/errcode"
)

// MaxSize bounds every record read; records are small, and an unbounded read of a file that
// something else grew would be a way to exhaust memory.
const MaxSize = 1 << 20

// Perm is the mode of every record: private to the service's user.
const Perm = 0o600

// FormatError is wrapped by the error of reading a record whose format this version does not
// know.
type FormatError struct {
	Record string
	Format int
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s has format %d, which this version of bothyd does not know", e.Record, e.Format)
}

// Decode checks a record's format number before decoding the rest into v, and refuses a format
// other than want with a [FormatError] naming it.
func Decode(name string, data []byte, want int, v any) error {
	var probe struct {
		Format *int `json:"format"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return errcode.Wrap(errcode.Internal, err, "The record %s is not valid JSON; run bothyd check.", name)
	}
	got := 0
	if probe.Format != nil {
		got = *probe.Format
	}
	if got != want {
		return errcode.Wrap(errcode.Internal, &FormatError{Record: name, Format: got},
			"The record %s has format %d, which this version of bothyd does not know (it knows %d); run a bothyd that does.", name, got, want)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return errcode.Wrap(errcode.Internal, err, "The record %s does not decode; run bothyd check.", name)
	}
	return nil
}

// Encode is the form of every record bothyd writes: indented JSON with a final newline, so
// that an operator can read it.
func Encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
