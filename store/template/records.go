package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/store"
)

// The format numbers of the records this version writes and reads. A record with another
// format is refused by name, never guessed at: bump a number when a change is not backward
// compatible, and teach the reader the old one if it must still be read.
const (
	TemplateFormat  = 1
	IndexFormat     = 1
	TombstoneFormat = 1
	LeaseFormat     = 1
	BindingFormat   = 1
)

// MaxRecordSize bounds every record read, as the sandbox store's.
const MaxRecordSize = record.MaxSize

// recordPerm is the mode of every record: private to the service's user.
const recordPerm = 0o600

// Resources are the resource limits that are part of a compatibility key: a sandbox's.
type Resources = store.Resources

// Key is a generation's compatibility key: a clone may use the generation only if its own key
// is equal, field by field.
type Key struct {
	// Runtime is the runtime identity (runtime kind, bothyd build, runtime configuration).
	Runtime string `json:"runtime"`
	Image   string `json:"image"`
	// ImageDigest is the manifest digest of an OCI image (store/image), "" for the host
	// image and root file system directories: a clone stacks the same layers.
	ImageDigest string    `json:"image_digest,omitempty"`
	Resources   Resources `json:"resources"`
}

// ClockBoottime names CLOCK_BOOTTIME, the monotonic clock of time contracts. See the package
// documentation ("Eligibility") for why it is BOOTTIME and not MONOTONIC.
const ClockBoottime = "boottime"

// TimeContract is a reading of the host's time: which host and boot it was taken on, the
// monotonic clock's reading and the UTC wall clock. A generation's contract is taken at
// capture; eligibility compares it with a reading taken now.
type TimeContract struct {
	HostID string `json:"host_id"`
	BootID string `json:"boot_id"`
	// Clock names the monotonic clock Monotonic was read from (ClockBoottime).
	Clock     string        `json:"clock"`
	Monotonic time.Duration `json:"monotonic_ns"`
	UTC       time.Time     `json:"utc"`
}

// templateRecord is template.json: its presence means the template exists.
type templateRecord struct {
	Format int    `json:"format"`
	Name   string `json:"name"`
	// UID tells this template apart from an earlier template of the same name, so that a
	// capture reserved under a deleted template never commits into a new one.
	UID       string    `json:"uid"`
	CreatedAt time.Time `json:"created_at"`
	// NextGeneration is the number the next capture gets; it only grows, so generation ids
	// are never reused within the template.
	NextGeneration uint64 `json:"next_generation"`
	// Deleting is set by a draining DeleteTemplate: no capture is accepted, and the record
	// goes when the last generation is retired.
	Deleting bool `json:"deleting,omitempty"`
}

// indexEntry is index.json: its presence means the generation is indexed.
type indexEntry struct {
	Format     int          `json:"format"`
	ID         string       `json:"id"`
	Template   string       `json:"template"`
	Key        Key          `json:"key"`
	Time       TimeContract `json:"time"`
	CapturedAt time.Time    `json:"captured_at"`
	SizeBytes  int64        `json:"size_bytes"`
	// PauseMS is how long the capture held its running sandbox frozen, in milliseconds
	// (at least 1); 0 for the capture of a sandbox that was stopped or paused already.
	PauseMS int64 `json:"capture_pause_ms,omitempty"`
	// Source is the generation's lineage (absent from entries written before it was kept).
	Source *Source `json:"source,omitempty"`
}

// tombstoneRecord is tombstone.json: its presence quarantines the generation.
type tombstoneRecord struct {
	Format int       `json:"format"`
	At     time.Time `json:"at"`
	// Drain records "retire when drained": the release of the last lease finishes the
	// retirement.
	Drain bool `json:"drain,omitempty"`
}

// leaseRecord is leases/<id>.json.
type leaseRecord struct {
	Format     int       `json:"format"`
	ID         string    `json:"id"`
	Template   string    `json:"template"`
	Generation string    `json:"generation"`
	Sandbox    string    `json:"sandbox"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// Binding is clone.json, the clone binding in a cloned sandbox's state directory: which lease
// of which generation the sandbox holds.
type Binding struct {
	Format     int       `json:"format"`
	Template   string    `json:"template"`
	Generation string    `json:"generation"`
	Lease      string    `json:"lease"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// FormatError is wrapped by the error of reading a record whose format this version does not
// know: the store's, since the two stores decode their records by one rule ([record.Decode]).
type FormatError = record.FormatError

// ErrBadRecord is wrapped by the error of a record that decodes but names invalid ids.
var ErrBadRecord = errors.New("record holds an invalid field")

// decodeRecord checks the format number of a record before decoding the rest.
func decodeRecord(name string, data []byte, want int, v any) error {
	return record.Decode("templates/"+name, data, want, v)
}

func badRecord(name, format string, args ...any) error {
	return errcode.Wrap(errcode.Internal, fmt.Errorf("%w: %s", ErrBadRecord, fmt.Sprintf(format, args...)),
		"The template store record %s is damaged; run bothyd check.", name)
}

func decodeTemplate(data []byte) (*templateRecord, error) {
	var r templateRecord
	if err := decodeRecord(TemplateRecordName, data, TemplateFormat, &r); err != nil {
		return nil, err
	}
	if !naming.ValidID(r.Name) || r.NextGeneration == 0 {
		return nil, badRecord(TemplateRecordName, "name %q, next generation %d", clip(r.Name), r.NextGeneration)
	}
	return &r, nil
}

func decodeIndex(data []byte) (*indexEntry, error) {
	var r indexEntry
	if err := decodeRecord(IndexName, data, IndexFormat, &r); err != nil {
		return nil, err
	}
	if _, ok := parseGeneration(r.ID); !ok || !naming.ValidID(r.Template) || r.SizeBytes < 0 {
		return nil, badRecord(IndexName, "id %q, template %q, size %d", clip(r.ID), clip(r.Template), r.SizeBytes)
	}
	if r.Source != nil && r.Source.Validate() != nil {
		return nil, badRecord(IndexName, "source %q", clip(r.Source.Sandbox))
	}
	return &r, nil
}

func decodeTombstone(data []byte) (*tombstoneRecord, error) {
	var r tombstoneRecord
	if err := decodeRecord(TombstoneName, data, TombstoneFormat, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func decodeLease(data []byte) (*leaseRecord, error) {
	var r leaseRecord
	if err := decodeRecord("lease record", data, LeaseFormat, &r); err != nil {
		return nil, err
	}
	if _, ok := parseGeneration(r.Generation); !ok || !validLeaseID(r.ID) || !naming.ValidID(r.Template) || !naming.ValidID(r.Sandbox) {
		return nil, badRecord("lease record", "id %q, template %q, generation %q, sandbox %q", clip(r.ID), clip(r.Template), clip(r.Generation), clip(r.Sandbox))
	}
	return &r, nil
}

// DecodeBinding decodes the content of a clone binding, refusing an unknown format and
// invalid ids.
func DecodeBinding(data []byte) (*Binding, error) {
	var r Binding
	if err := decodeRecord(BindingFile, data, BindingFormat, &r); err != nil {
		return nil, err
	}
	if _, ok := parseGeneration(r.Generation); !ok || !validLeaseID(r.Lease) || !naming.ValidID(r.Template) {
		return nil, badRecord(BindingFile, "template %q, generation %q, lease %q", clip(r.Template), clip(r.Generation), clip(r.Lease))
	}
	return &r, nil
}

// readRecordFile reads a record under dir; found is false, with no error, when it does not
// exist. It never follows a link or blocks on a FIFO.
func readRecordFile(dir *os.File, name string) (data []byte, found bool, err error) {
	data, err = platform.ReadFileAt(dir, name, MaxRecordSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, recordErr(name, err)
	}
	return data, true, nil
}

func recordErr(name string, err error) error {
	if errors.Is(err, platform.ErrNotRegular) {
		return errcode.Wrap(errcode.Internal, err, "The template store record %s is not a regular file; remove it by hand.", name)
	}
	return fmt.Errorf("template: %s: %w", name, err)
}

// ErrNoBinding is wrapped by ReadBinding's error when the sandbox has no clone binding; it
// matches fs.ErrNotExist as well.
var ErrNoBinding = fmt.Errorf("no clone binding: %w", fs.ErrNotExist)

// WriteBinding writes b as clone.json in the sandbox state directory dir, atomically and
// durably (temp file, fsync, rename, fsync of dir), stamped with the current format. The
// caller holds the sandbox's lifecycle lock and the template store's lock, and has written
// the lease record first.
func WriteBinding(dir string, b *Binding) (err error) {
	defer func() { err = bindingStorage(err, dir) }()
	rec := *b
	rec.Format = BindingFormat
	if _, ok := parseGeneration(rec.Generation); !ok || !validLeaseID(rec.Lease) || !naming.ValidID(rec.Template) {
		return fmt.Errorf("template: clone binding names template %q, generation %q, lease %q: %w", rec.Template, rec.Generation, rec.Lease, ErrBadRecord)
	}
	data, err := record.Encode(&rec)
	if err != nil {
		return err
	}
	if err := platform.WriteFileDurable(dir, BindingFile, data, recordPerm); err != nil {
		return recordErr(BindingFile, err)
	}
	bindingHook("binding:write")
	return nil
}

// ReadBinding reads clone.json from the sandbox state directory dir without following a link
// or blocking on a FIFO, refusing anything but a regular file. A missing binding is an error
// that matches ErrNoBinding (and fs.ErrNotExist).
func ReadBinding(dir string) (_ *Binding, err error) {
	defer func() { err = bindingStorage(err, dir) }()
	d, err := platform.OpenDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, ErrNoBinding
		}
		return nil, err
	}
	defer d.Close()
	data, found, err := readRecordFile(d, BindingFile)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNoBinding
	}
	return DecodeBinding(data)
}

// RemoveBinding removes clone.json from dir durably (unlink, then fsync of dir). No binding is
// not an error. Removal of a clone calls it before releasing the lease.
func RemoveBinding(dir string) (err error) {
	defer func() { err = bindingStorage(err, dir) }()
	d, err := platform.OpenDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	defer d.Close()
	if err := platform.UnlinkAt(d, BindingFile); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := platform.SyncDir(d); err != nil {
		return err
	}
	bindingHook("binding:remove")
	return nil
}

// bindingStorage is errcode.Storage for the binding functions, which know the sandbox's
// state directory, <state root>/sandboxes/<id>, rather than a store.
func bindingStorage(err error, dir string) error {
	return errcode.Storage(err, filepath.Dir(filepath.Dir(dir)))
}

// testBindingHook, set only by tests, sees the durable points of the binding functions, which
// have no store to carry a hook.
var testBindingHook atomic.Pointer[func(step string)]

func bindingHook(step string) {
	if h := testBindingHook.Load(); h != nil {
		(*h)(step)
	}
}
