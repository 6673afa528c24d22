package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
)

// The format numbers of the records this version writes and reads. A record with another
// format is refused by name, never guessed at: bump the number when a change is not
// backward compatible, and teach the reader the old one if it must still be read.
const (
	ConfigFormat  = 1
	LaunchFormat  = 1
	RuntimeFormat = 1
)

// MaxRecordSize bounds every record read; records are small, and an unbounded read of a file
// that something else grew would be a way to exhaust memory.
const MaxRecordSize = record.MaxSize

// recordPerm is the mode of every record: private to the service's user.
const recordPerm = record.Perm

// Config is the configuration record, config.json. Its presence means "provisioned".
type Config struct {
	Format    int       `json:"format"`
	ID        string    `json:"id"`
	Image     string    `json:"image"`
	Resources Resources `json:"resources"`
	// DiskMB is the size of the sandbox's own disk, which holds its writable layer; 0 means
	// none (the layer lives in the state directory, bounded only by the state root's file
	// system). It is not among Resources because it is no part of a template generation's
	// compatibility key: a clone's disk holds only what the clone writes.
	DiskMB    int               `json:"disk_mb,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// Template is set for a sandbox cloned from a template generation. The lease id lives in
	// the clone binding (clone.json), which the template store owns.
	Template *TemplateRef `json:"template,omitempty"`
	// Network is the sandbox's egress policy (see the network package); nil, like a policy
	// that allows nothing, means no interface but lo. A live change rewrites it, so that the
	// next start, and a restarted bothyd's reattach, apply the policy in force.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Runtime is the kind of the runtime the sandbox runs under ("namespace", "microvm"); ""
	// (a record written before there was a choice) means the server's default runtime.
	Runtime string `json:"runtime,omitempty"`
	// Spare marks a sandbox started ahead for a create that has not come yet (the
	// supervisor's spares): it is no client's, so listings, lookups and events leave it out
	// until a create claims it, which rewrites the record without the mark.
	Spare bool `json:"spare,omitempty"`
	// Sleep, when set, lets the sandbox sleep (pause) when idle and wake on use.
	Sleep *SleepPolicy `json:"sleep,omitempty"`
	// Volumes are the volumes the sandbox mounts (package volume), each held by it (a hold
	// recorded in the volume's directory before this record names it) until it is deleted.
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// VolumeMount is a volume mounted into a sandbox: its name, where inside, and whether
// read-only (validated by package volume before it is recorded).
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// SleepPolicy is when a sandbox sleeps and whether use wakes it (package idle, the
// supervisor's sleep.go).
type SleepPolicy struct {
	// IdleTimeoutS is how long, in seconds, the sandbox may go unused before it is paused.
	IdleTimeoutS int `json:"idle_timeout_s"`
	// AutoResume: a request that needs the sandbox while it is paused wakes it.
	AutoResume bool `json:"auto_resume"`
	// IgnoreWork: work running inside does not keep the sandbox awake; only use through the
	// API does.
	IgnoreWork bool `json:"ignore_work,omitempty"`
}

// NetworkPolicy is a sandbox's egress policy as recorded: the API's form, each entry as it
// was written (validated by the supervisor with network.Parse before it is recorded).
type NetworkPolicy struct {
	Internet bool     `json:"internet"`
	Allow    []string `json:"allow,omitempty"`
	Deny     []string `json:"deny,omitempty"`
	// Secrets bind secrets to hosts, for the egress proxy (docs/secrets.md). They name
	// secrets and hold no value.
	Secrets []SecretBinding `json:"secrets,omitempty"`
}

// SecretBinding is a secret bound to hosts in a recorded policy (network.SecretBinding).
type SecretBinding struct {
	Secret string        `json:"secret"`
	Hosts  []string      `json:"hosts"`
	Header *SecretHeader `json:"header,omitempty"`
}

// SecretHeader is a header the egress proxy sets on requests to a bound host.
type SecretHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Resources are a sandbox's resource limits.
type Resources struct {
	VCPUs    int `json:"vcpus"`
	MemoryMB int `json:"memory_mb"`
	Pids     int `json:"pids"`
}

// String is r as the API's field names say it, "vcpus=1 memory_mb=512 pids=512", for messages
// that callers read.
func (r Resources) String() string {
	return fmt.Sprintf("vcpus=%d memory_mb=%d pids=%d", r.VCPUs, r.MemoryMB, r.Pids)
}

// TemplateRef names the template generation a sandbox was cloned from.
type TemplateRef struct {
	Template   string `json:"template"`
	Generation string `json:"generation"`
}

// LaunchJournal is launch.json: written durably before a runtime process is started (with
// Pid 0), possibly rewritten once the process exists (with its identity), and removed when
// the launch commits or is abandoned.
type LaunchJournal struct {
	Format       int       `json:"format"`
	LaunchID     string    `json:"launch_id"`
	RuntimeID    string    `json:"runtime_id"`
	StartedAt    time.Time `json:"started_at"`
	Pid          int       `json:"pid"`
	PidStartTime uint64    `json:"pid_start_time"`
	BootID       string    `json:"boot_id"`
}

// RuntimeRecord is runtime.json: the identity of a committed launch's live runtime process.
type RuntimeRecord struct {
	Format        int       `json:"format"`
	LaunchID      string    `json:"launch_id"`
	RuntimeKind   string    `json:"runtime_kind"`
	RuntimeID     string    `json:"runtime_id"`
	Pid           int       `json:"pid"`
	PidStartTime  uint64    `json:"pid_start_time"`
	BootID        string    `json:"boot_id"`
	ControlSocket string    `json:"control_socket"`
	StartedAt     time.Time `json:"started_at"`
}

// readRecord reads and decodes a record under dir. It reports found=false, with no error,
// when the record does not exist; it never follows a link or blocks on a FIFO.
func readRecord(dir *os.File, name string, format int, v any) (found bool, err error) {
	data, err := platform.ReadFileAt(dir, name, MaxRecordSize)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, recordErr(name, err)
	}
	return true, record.Decode(name, data, format, v)
}

// read is readRecord at the store's boundary: an EIO reads as storage-unavailable.
func (s *Store) read(dir *os.File, name string, format int, v any) (bool, error) {
	found, err := readRecord(dir, name, format, v)
	return found, s.storage(err)
}

func recordErr(name string, err error) error {
	if errors.Is(err, platform.ErrNotRegular) {
		return errcode.Wrap(errcode.Internal, err, "The record %s is not a regular file; remove it by hand.", name)
	}
	return fmt.Errorf("store: %s: %w", name, err)
}

// writeRecord writes a record durably. A write that fails leaves the record as it was: a
// record that did not exist before is removed again if the failure came after the rename
// (the directory's fsync failed), so that a failed write never leaves a record the caller
// was told is not there. If that removal fails too, the record stays, whole: a state every
// reader and the next transition accept (see the package documentation, "Faults").
func (l *Lock) writeRecord(name string, v any) error {
	return l.writeRecordWith(l.s.fs.WriteFileDurableAt, name, v)
}

// writeRecordWith is writeRecord through write, a replacement of [platform.FS].
func (l *Lock) writeRecordWith(write func(*os.File, string, []byte, fs.FileMode) error, name string, v any) error {
	data, err := record.Encode(v)
	if err != nil {
		return err
	}
	_, lerr := platform.LstatAt(l.dir, name)
	fresh := errors.Is(lerr, fs.ErrNotExist)
	if err := write(l.dir, name, data, recordPerm); err != nil {
		if fresh {
			err = errors.Join(err, l.undoFresh(name))
		}
		return l.s.storage(recordErr(name, err))
	}
	return nil
}

// undoFresh removes the record name that a failed write may have renamed into place.
func (l *Lock) undoFresh(name string) error {
	if _, err := platform.LstatAt(l.dir, name); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := l.removeRecord(name); err != nil {
		return fmt.Errorf("store: undoing the failed write of %s: %w", name, err)
	}
	return nil
}

func (l *Lock) removeRecord(name string) error {
	return l.removeRecordSynced(name, true)
}

// removeRecordSynced removes the record name, and with sync makes the removal durable.
func (l *Lock) removeRecordSynced(name string, sync bool) error {
	err := l.s.fs.UnlinkAt(l.dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return l.s.storage(fmt.Errorf("store: remove %s: %w", name, err))
	}
	if !sync {
		return nil
	}
	return l.s.storage(l.s.fs.SyncDir(l.dir))
}

// Config reads the configuration record. A missing record is a sandbox-not-found error that
// wraps fs.ErrNotExist.
func (l *Lock) Config() (*Config, error) {
	var c Config
	found, err := l.s.read(l.dir, ConfigName, ConfigFormat, &c)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, notFound(l.id, fs.ErrNotExist)
	}
	return &c, nil
}

// WriteConfig writes the configuration record atomically and durably (the record, the state
// directory and the state directory's entry in the sandboxes directory), stamped with the
// current format. Its ID must be the lock's.
func (l *Lock) WriteConfig(c *Config) error {
	if c.ID != l.id {
		return fmt.Errorf("store: configuration record for %q written under the lock of %q", c.ID, l.id)
	}
	rec := *c
	rec.Format = ConfigFormat
	_, lerr := platform.LstatAt(l.dir, ConfigName)
	fresh := errors.Is(lerr, fs.ErrNotExist)
	if err := l.writeRecord(ConfigName, &rec); err != nil {
		return err
	}
	// The record is durable only if the state directory's own entry is: a crash after a
	// provision made the directory, before anything synced the sandboxes directory, could
	// otherwise lose the directory with the record in it.
	if err := l.s.fs.SyncDir(l.s.sbx); err != nil {
		// A provision that fails must not leave the sandbox provisioned.
		if fresh {
			err = errors.Join(err, l.undoFresh(ConfigName))
		}
		return l.s.storage(err)
	}
	return nil
}

// LaunchJournal reads the launch journal; (nil, nil) when there is none.
func (l *Lock) LaunchJournal() (*LaunchJournal, error) {
	var j LaunchJournal
	found, err := l.s.read(l.dir, LaunchName, LaunchFormat, &j)
	if err != nil || !found {
		return nil, err
	}
	return &j, nil
}

// WriteLaunchJournal writes the launch journal atomically, whole but not durably
// ([platform.WriteFileWholeAt]), stamped with the current format. The journal speaks of
// processes, which a crash of the host ends: after one, the journal may be absent or an
// earlier version of itself, whole, and either way it names a launch of an earlier boot that
// nothing of runs. What it is for, a crash of bothyd, keeps the page cache, and so the
// journal as written. Against a crash of the host it would only save the outcome
// "start-failed" of a start that never answered; two directory fsyncs a start are worth more.
func (l *Lock) WriteLaunchJournal(j *LaunchJournal) error {
	rec := *j
	rec.Format = LaunchFormat
	return l.writeRecordWith(l.s.fs.WriteFileWholeAt, LaunchName, &rec)
}

// RemoveLaunchJournal removes the launch journal durably; no journal is not an error.
func (l *Lock) RemoveLaunchJournal() error { return l.removeRecord(LaunchName) }

// RemoveCommittedLaunchJournal removes the journal of a launch whose runtime record is
// written: without a directory fsync, since a journal that a crash of the host brings back
// beside the runtime record of its launch is removed by the next reattach.
func (l *Lock) RemoveCommittedLaunchJournal() error {
	return l.removeRecordSynced(LaunchName, false)
}

// RuntimeRecord reads the runtime record; (nil, nil) when there is none.
func (l *Lock) RuntimeRecord() (*RuntimeRecord, error) {
	var r RuntimeRecord
	found, err := l.s.read(l.dir, RuntimeName, RuntimeFormat, &r)
	if err != nil || !found {
		return nil, err
	}
	return &r, nil
}

// WriteRuntimeRecord writes the runtime record atomically and durably, stamped with the
// current format.
func (l *Lock) WriteRuntimeRecord(r *RuntimeRecord) error {
	rec := *r
	rec.Format = RuntimeFormat
	return l.writeRecord(RuntimeName, &rec)
}

// RemoveRuntimeRecord removes the runtime record durably; no record is not an error.
func (l *Lock) RemoveRuntimeRecord() error { return l.removeRecord(RuntimeName) }

// Outcome reads the outcome report; (nil, nil) when there is none.
func (l *Lock) Outcome() (*runtime.Outcome, error) {
	var o runtime.Outcome
	found, err := l.s.read(l.dir, OutcomeName, runtime.OutcomeFormat, &o)
	if err != nil || !found {
		return nil, err
	}
	return &o, nil
}

// RemoveOutcome removes the outcome report durably; no report is not an error.
func (l *Lock) RemoveOutcome() error { return l.removeRecord(OutcomeName) }

// openUnlocked opens id's state directory for a read without the lock.
func (s *Store) openUnlocked(id string) (*os.File, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	dir, err := platform.OpenDirAt(s.sbx, id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notFound(id, err)
	}
	if err != nil {
		return nil, s.storage(errcode.Wrap(errcode.Internal, err, "The state directory of sandbox %s is not a directory; remove it by hand.", id))
	}
	return dir, nil
}

// ReadConfigUnlocked reads id's configuration record without taking the lock, for listing
// and reading: records are replaced by rename, so the read sees a whole record. A missing
// directory or record is sandbox-not-found.
func (s *Store) ReadConfigUnlocked(id string) (*Config, error) {
	dir, err := s.openUnlocked(id)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	var c Config
	found, err := s.read(dir, ConfigName, ConfigFormat, &c)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, notFound(id, fs.ErrNotExist)
	}
	return &c, nil
}

// ReadRuntimeRecordUnlocked reads id's runtime record without the lock; (nil, nil) when the
// directory exists but has none, sandbox-not-found when the directory is missing.
func (s *Store) ReadRuntimeRecordUnlocked(id string) (*RuntimeRecord, error) {
	dir, err := s.openUnlocked(id)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	var r RuntimeRecord
	found, err := s.read(dir, RuntimeName, RuntimeFormat, &r)
	if err != nil || !found {
		return nil, err
	}
	return &r, nil
}

// ReadLaunchJournalUnlocked reads id's launch journal without the lock; (nil, nil) when the
// directory exists but has none, sandbox-not-found when the directory is missing.
func (s *Store) ReadLaunchJournalUnlocked(id string) (*LaunchJournal, error) {
	dir, err := s.openUnlocked(id)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	var j LaunchJournal
	found, err := s.read(dir, LaunchName, LaunchFormat, &j)
	if err != nil || !found {
		return nil, err
	}
	return &j, nil
}

// ReadOutcomeUnlocked reads id's outcome report without the lock; (nil, nil) when the
// directory exists but has none, sandbox-not-found when the directory is missing.
func (s *Store) ReadOutcomeUnlocked(id string) (*runtime.Outcome, error) {
	dir, err := s.openUnlocked(id)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	var o runtime.Outcome
	found, err := s.read(dir, OutcomeName, runtime.OutcomeFormat, &o)
	if err != nil || !found {
		return nil, err
	}
	return &o, nil
}
