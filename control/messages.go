package control

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"
)

// ProtocolVersion is the version of this protocol. Client and agent must agree on it exactly;
// it is part of a sandbox's runtime identity, so a sandbox started by a build with another
// version is never driven by this one.
const ProtocolVersion = 2

// The features an agent of this version announces in its hello answer.
const (
	FeatureExec     = "exec"
	FeatureTTY      = "tty"
	FeatureFiles    = "files"
	FeatureShutdown = "shutdown"
	FeatureStats    = "stats"
)

// RequiredFeatures are the features Dial insists on: bothyd needs all of them to serve the
// API, so an agent without one is not a usable sandbox.
var RequiredFeatures = []string{FeatureExec, FeatureTTY, FeatureFiles, FeatureShutdown, FeatureStats}

// Op names the operation of a stream; it is the "op" field of the header frame.
type Op string

// The operations.
const (
	OpHello    Op = "hello"
	OpExec     Op = "exec"
	OpRead     Op = "read"
	OpWrite    Op = "write"
	OpList     Op = "list"
	OpStat     Op = "stat"
	OpMkdir    Op = "mkdir"
	OpRemove   Op = "remove"
	OpShutdown Op = "shutdown"
	OpStats    Op = "stats"
)

// Header is the JSON payload of the first frame of a stream. Op selects which of the other
// fields is used.
type Header struct {
	Op       Op               `json:"op"`
	Hello    *HelloRequest    `json:"hello,omitempty"`
	Exec     *ExecRequest     `json:"exec,omitempty"`
	File     *FileRequest     `json:"file,omitempty"`
	Shutdown *ShutdownRequest `json:"shutdown,omitempty"`
	Dial     *DialRequest     `json:"dial,omitempty"`
	Watch    *WatchRequest    `json:"watch,omitempty"`
	Proc     *ProcRequest     `json:"proc,omitempty"`
	Network  *NetworkRequest  `json:"network,omitempty"`
}

// DecodeHeader parses and validates a header frame's payload. Unknown JSON fields are ignored
// so that a newer client can add optional fields; a missing or malformed operation is an error.
func DecodeHeader(b []byte) (*Header, error) {
	var h Header
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, invalidf("The header frame is not valid JSON: %v.", err)
	}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return &h, nil
}

// Validate checks that the header names a known operation and carries a valid request for it.
func (h *Header) Validate() error {
	switch h.Op {
	case OpHello:
		if h.Hello == nil {
			return invalidf("A hello header needs a hello request.")
		}
	case OpExec:
		if h.Exec == nil {
			return invalidf("An exec header needs an exec request.")
		}
		return h.Exec.Validate()
	case OpRead, OpWrite, OpList, OpStat, OpMkdir, OpRemove:
		if h.File == nil {
			return invalidf("A %s header needs a file request.", h.Op)
		}
		return h.File.Validate()
	case OpShutdown:
		if h.Shutdown == nil {
			return invalidf("A shutdown header needs a shutdown request.")
		}
		if h.Shutdown.GraceMS < 0 || h.Shutdown.GraceMS > maxGraceMS {
			return invalidf("The shutdown grace must be between 0 and %d milliseconds.", maxGraceMS)
		}
	case OpStats:
	case OpDial:
		if h.Dial == nil {
			return invalidf("A dial header needs a dial request.")
		}
		return h.Dial.Validate()
	case OpWatch:
		if h.Watch == nil {
			return invalidf("A watch header needs a watch request.")
		}
		return h.Watch.Validate()
	case OpProcStart, OpProcAttach, OpProcList, OpProcInput:
		return validateProcHeader(h)
	case OpNetwork:
		if h.Network == nil {
			return invalidf("A network header needs a network request.")
		}
		return h.Network.Validate()
	default:
		return invalidf("Unknown operation %q.", h.Op)
	}
	return nil
}

// HelloRequest opens a connection: the first stream must carry it, and nothing else is served
// until it succeeded.
type HelloRequest struct {
	Protocol   int    `json:"protocol"`
	Capability []byte `json:"capability"`
}

// HelloResponse is the agent's answer to hello.
type HelloResponse struct {
	Protocol     int      `json:"protocol"`
	Features     []string `json:"features"`
	AgentVersion string   `json:"agent_version"`
}

// Users a request may name. An empty user means User.
const (
	User = "user"
	Root = "root"
)

// Limits on requests. They bound what one header can make the agent hold.
const (
	MaxPathLen   = 4096
	maxArgs      = 4096
	maxEnv       = 4096
	maxTimeoutMS = 7 * 24 * 3600 * 1000
	maxGraceMS   = 3600 * 1000
)

// ExecRequest is the header of an exec stream.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Env entries are K=V; they override the agent's defaults of the same name.
	Env []string `json:"env,omitempty"`
	// Cwd is an absolute path; empty means the user's home.
	Cwd string `json:"cwd,omitempty"`
	// User is "user" (the default) or "root".
	User string `json:"user,omitempty"`
	TTY  bool   `json:"tty,omitempty"`
	// Rows and Cols are the initial terminal size with TTY (default 24x80).
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// TimeoutMS, when positive, kills the workload that long after it started.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin says the client will send stdin frames; without it the workload's stdin is
	// /dev/null (or, with TTY, a terminal nobody types into).
	Stdin bool `json:"stdin,omitempty"`
	// Umask is the workload's file mode creation mask (0 to 0777). Absent, it is DefaultUmask:
	// a workload never inherits the agent's own mask, so that what root creates is not
	// writable by the sandbox's user unless the request asks for it.
	Umask *uint32 `json:"umask,omitempty"`
	// StdoutPipe, when not 0, is the number of a descriptor passed with the request
	// ([FeatureStdoutPipe]): the write end of a pipe whose read end bothyd holds. The
	// workload's stdout is that pipe, and no stdout frames come. Never with TTY.
	StdoutPipe uint64 `json:"stdout_pipe,omitempty"`
}

// DefaultUmask is the workload's umask when the exec request names none: files 0644 and
// directories 0755, as a login shell makes them.
const DefaultUmask = 0o022

// EffectiveUmask is the umask the workload runs with: the request's, or DefaultUmask.
func (r *ExecRequest) EffectiveUmask() uint32 {
	if r.Umask == nil {
		return DefaultUmask
	}
	return *r.Umask
}

// Validate checks the request's shape; whether the command, cwd or user exist is for the agent
// to find out.
func (r *ExecRequest) Validate() error {
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return invalidf("The command must name a program.")
	}
	if len(r.Argv) > maxArgs {
		return invalidf("The command has more than %d arguments.", maxArgs)
	}
	for _, a := range r.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalidf("A command argument contains a NUL byte.")
		}
	}
	if len(r.Env) > maxEnv {
		return invalidf("The environment has more than %d entries.", maxEnv)
	}
	for _, e := range r.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.IndexByte(e, 0) >= 0 {
			return invalidf("Environment entry %q is not of the form NAME=value.", truncate(e))
		}
	}
	if r.Cwd != "" {
		if err := ValidatePath(r.Cwd); err != nil {
			return err
		}
	}
	if err := validateUser(r.User); err != nil {
		return err
	}
	if r.TimeoutMS < 0 || r.TimeoutMS > maxTimeoutMS {
		return invalidf("The timeout must be between 0 and %d milliseconds.", int64(maxTimeoutMS))
	}
	if r.Umask != nil && *r.Umask > 0o777 {
		return invalidf("The umask %#o has bits beyond permissions; give one between 0 and 0777.", *r.Umask)
	}
	if r.StdoutPipe != 0 && r.TTY {
		return invalidf("A terminal's output cannot go to a passed pipe.")
	}
	return nil
}

// WindowSize is the payload of a resize frame.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// SignalRequest is the payload of a signal frame. Name is a signal name with or without the
// SIG prefix ("TERM", "SIGINT").
type SignalRequest struct {
	Name string `json:"name"`
}

// Started is the payload of the started frame.
type Started struct {
	PID int `json:"pid"`
}

// ExitStatus is how a workload ended: the payload of the exit frame.
type ExitStatus struct {
	// ExitCode is the exit code, or 128+signal number when a signal ended the workload, as a
	// shell reports it.
	ExitCode int `json:"exit_code"`
	// Signal is the name of the signal that ended it, without the SIG prefix ("TERM"), if any.
	Signal string `json:"signal,omitempty"`
	// TimedOut says the agent killed it because its timeout passed.
	TimedOut bool `json:"timed_out,omitempty"`
	// OOM says the kernel's out-of-memory killer ended it (best effort: known only where the
	// agent can read its cgroup's OOM counter).
	OOM bool `json:"oom,omitempty"`
}

// FileRequest is the header of the file operations (read, write, list, stat, mkdir, remove).
type FileRequest struct {
	// Path is absolute, inside the sandbox.
	Path string `json:"path"`
	// User is whose permissions the operation runs with: "user" (the default) or "root".
	User string `json:"user,omitempty"`
	// Mode is the permission bits for write and mkdir (0 means 0644 and 0755).
	Mode uint32 `json:"mode,omitempty"`
	// MakeParents creates missing parent directories for write and mkdir.
	MakeParents bool `json:"make_parents,omitempty"`
	// Recursive removes a directory with its contents.
	Recursive bool `json:"recursive,omitempty"`
	// Limit is, for list, the most entries the agent sends (0 means DefaultListLimit, at most
	// MaxListLimit). A listing cut at the limit ends with a ListEnd that says so.
	Limit int `json:"limit,omitempty"`
	// Details asks stat and list for each entry's owner, group, symlink target and user
	// metadata (feature "file-meta").
	Details bool `json:"details,omitempty"`
	// Metadata is, for write, the user metadata stored with the new file (feature
	// "file-meta"; see ValidateMetadata). The new file has no other: a write replaces the file.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Bounds of a listing: what one list makes both sides hold. DefaultListLimit is the cap the
// API has always applied to a listing.
const (
	DefaultListLimit = 10000
	MaxListLimit     = 100000
	// maxNameLen is the longest name a directory entry can have (NAME_MAX); a listing with a
	// longer one is malformed, which bounds the bytes a listing of Limit entries holds.
	maxNameLen = 255
)

// EffectiveLimit is the most entries a list answers.
func (r *FileRequest) EffectiveLimit() int {
	if r.Limit == 0 {
		return DefaultListLimit
	}
	return r.Limit
}

// ListEnd is the payload of the end frame of a list; an empty payload means a complete
// listing.
type ListEnd struct {
	// Truncated says the directory has more entries than the request's limit.
	Truncated bool `json:"truncated,omitempty"`
}

// Validate checks the path and user.
func (r *FileRequest) Validate() error {
	if err := ValidatePath(r.Path); err != nil {
		return err
	}
	if r.Mode&^uint32(fs.ModePerm|0o7000) != 0 {
		return invalidf("The mode %#o has bits beyond permissions.", r.Mode)
	}
	if r.Limit < 0 || r.Limit > MaxListLimit {
		return invalidf("The listing limit must be between 0 and %d entries.", MaxListLimit)
	}
	if err := ValidateMetadata(r.Metadata); err != nil {
		return err
	}
	return validateUser(r.User)
}

// ValidatePath refuses what must never reach a file operation: relative paths, NUL bytes and
// paths longer than MaxPathLen.
func ValidatePath(p string) error {
	switch {
	case p == "":
		return invalidf("The path is empty; give an absolute path inside the sandbox.")
	case len(p) > MaxPathLen:
		return invalidf("The path is longer than %d bytes.", MaxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return invalidf("The path contains a NUL byte.")
	case !path.IsAbs(p):
		return invalidf("The path %q is relative; give an absolute path inside the sandbox.", truncate(p))
	}
	return nil
}

func validateUser(u string) error {
	switch u {
	case "", User, Root:
		return nil
	}
	return invalidf("Unknown user %q; use %q or %q.", truncate(u), User, Root)
}

// FileType is the kind of a directory entry.
type FileType string

// The file types.
const (
	TypeFile    FileType = "file"
	TypeDir     FileType = "dir"
	TypeSymlink FileType = "symlink"
	TypeOther   FileType = "other"
)

// FileInfo describes a file, as list and stat answer.
type FileInfo struct {
	Name string   `json:"name"`
	Type FileType `json:"type"`
	Size int64    `json:"size"`
	// Mode is the permission bits (with setuid, setgid and sticky).
	Mode       uint32    `json:"mode"`
	ModifiedAt time.Time `json:"modified_at"`
	// The details, with FileRequest.Details: the owner's and group's names as the sandbox's
	// /etc/passwd and /etc/group have them (the number where they have none); for a
	// symlink, the absolute path it resolves to (its own where it resolves nowhere) and the
	// type and mode of what is there (none where nothing is); the user metadata
	// (MetadataXattrPrefix attributes the user may read).
	Owner      string            `json:"owner,omitempty"`
	Group      string            `json:"group,omitempty"`
	Target     string            `json:"target,omitempty"`
	TargetType FileType          `json:"target_type,omitempty"`
	TargetMode uint32            `json:"target_mode,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

// ReadResult opens the answer to a read: the size of the file the agent opened, taken from
// that open file, so that exactly this many data bytes follow; or -1 (UnknownSize) for a file
// whose size says nothing of its content (those of /proc and /sys), read until its end.
type ReadResult struct {
	Size int64 `json:"size"`
}

// UnknownSize is ReadResult.Size for a file read until its end.
const UnknownSize = -1

// WriteResult is the result of a write.
type WriteResult struct {
	Size int64 `json:"size"`
}

// ShutdownRequest asks the agent to end the sandbox.
type ShutdownRequest struct {
	GraceMS int64 `json:"grace_ms"`
}

// Stats is the sandbox's resource usage.
type Stats struct {
	MemoryBytes uint64 `json:"memory_bytes"`
	CPUUsec     uint64 `json:"cpu_usec"`
	Pids        int    `json:"pids"`
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func invalidf(format string, args ...any) *RemoteError {
	return &RemoteError{Code: CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}
