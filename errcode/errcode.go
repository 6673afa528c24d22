// Package errcode defines the stable, kebab-case error codes that domain packages attach to
// their errors and that clients switch on. It knows nothing of HTTP: the server alone maps a
// code to a status. Domain packages return [*Error] values ([New], [Wrap], [Invalid]) or wrap
// them; callers test them with errors.Is against a [Code], or read the code with [Of].
//
// It is a leaf, imported by both sides of bothyd, and imports only the standard library. A
// code is part of the API contract: it is never renamed, and a new one also needs a status in
// the server and an entry in openapi.yaml (CONTRIBUTING.md, "Adding an error code").
package errcode

import (
	"errors"
	"fmt"
)

// Code is a stable error code, part of the API contract. Never rename one.
type Code string

// The codes of docs/design.md's error table, including the few the HTTP layer itself produces.
const (
	InvalidRequest Code = "invalid-request"
	Unauthorized   Code = "unauthorized"
	Forbidden      Code = "forbidden" // a browser request from a foreign origin or host
	// PermissionDenied: the sandbox's user may not do this to the path (EACCES, EPERM, a
	// read-only file system), or search an exec's cwd.
	PermissionDenied Code = "permission-denied"
	NotFound         Code = "not-found" // an unknown route
	MethodNotAllowed Code = "method-not-allowed"
	PayloadTooLarge  Code = "payload-too-large"
	NotImplemented   Code = "not-implemented"
	Internal         Code = "internal"
	Unavailable      Code = "unavailable" // shutting down

	SandboxNotFound    Code = "sandbox-not-found"
	TemplateNotFound   Code = "template-not-found"
	GenerationNotFound Code = "generation-not-found"
	FileNotFound       Code = "file-not-found"
	ImageNotFound      Code = "image-not-found"

	AlreadyProvisioned Code = "already-provisioned"
	ProvisionedAgain   Code = "provisioned-again"
	AlreadyRunning     Code = "already-running"
	NotRunning         Code = "not-running"
	SandboxLaunched    Code = "sandbox-launched"
	ForeignFiles       Code = "foreign-files"
	RuntimeMismatch    Code = "runtime-mismatch"
	TemplateExists     Code = "template-exists"
	TemplateTombstoned Code = "template-tombstoned"
	TemplateIneligible Code = "template-ineligible"
	SandboxPaused      Code = "sandbox-paused" // exec, files and streams wait for a resume
	// The refusals a sandbox's own files make (the agent's errno, docs/design.md's error
	// table): the request is valid by the contract, and the same request may succeed once
	// the files change. Each is about the request's path (or an exec's cwd), which the
	// problem's field names.
	//
	// NotADirectory: a component of the path, or the path a listing or a cwd names, is not
	// a directory (ENOTDIR).
	NotADirectory Code = "not-a-directory"
	// IsADirectory: a directory was read or written as a file (EISDIR).
	IsADirectory Code = "is-a-directory"
	// NotARegularFile: the path is a FIFO, a device or a socket, which the file API does not
	// read.
	NotARegularFile Code = "not-a-regular-file"
	// DirectoryNotEmpty: a directory with entries was removed without recursive=true.
	DirectoryNotEmpty Code = "directory-not-empty"
	// FileExists: something is in the way of a directory the request makes (EEXIST).
	FileExists Code = "file-exists"
	// SymlinkLoop: resolving the path met too many symbolic links (ELOOP).
	SymlinkLoop Code = "symlink-loop"
	// MountInside: a recursive removal met another file system mounted inside the tree.
	MountInside Code = "mount-inside"
	// FileChanged: the file or tree changed under the operation (moved while it was
	// removed); repeat the request.
	FileChanged Code = "file-changed"

	// SandboxWaking: a sleeping sandbox that the request woke did not finish waking within
	// the request's wait; the wake goes on, and a retry is served (503 with Retry-After).
	SandboxWaking Code = "sandbox-waking"

	SandboxBusy          Code = "sandbox-busy"
	TransitionInProgress Code = "transition-in-progress"
	SandboxLeased        Code = "sandbox-leased"
	GenerationLeased     Code = "generation-leased"
	ImageInUse           Code = "image-in-use" // a sandbox or a template generation uses the image

	// WaitTimeout: the sandbox did not reach the state waited for in time.
	WaitTimeout Code = "wait-timeout"

	StopTimeout  Code = "stop-timeout"
	StartTimeout Code = "start-timeout"

	// PortUnreachable: nothing listens on the sandbox's port (a port connection).
	PortUnreachable Code = "port-unreachable"
	// LimitReached: the sandbox, the client or the server holds as many of something as it
	// may: port connections, port links, connections, streams (docs/security.md, "Bounds").
	LimitReached Code = "limit-reached"
	// PidsLimit: a command could not start because the sandbox's processes are at its pids
	// limit (resources.pids).
	PidsLimit Code = "pids-limit"
	// LinkNotFound: no port link has this id or token (it never existed, expired or was
	// revoked).
	LinkNotFound Code = "link-not-found"
	// WebhookNotFound: no webhook has this id (it never existed, or was deleted).
	WebhookNotFound Code = "webhook-not-found"
	// WebhookExists: a create named the id of a webhook that differs from it (a cluster's
	// router names the id; docs/cluster.md).
	WebhookExists Code = "webhook-exists"
	// IdempotencyKeyReused: an Idempotency-Key came again with another request (another
	// method, path or body) than the one it was first used for.
	IdempotencyKeyReused Code = "idempotency-key-reused"
	// NameTooLong: a name in the path is longer than the sandbox's file system holds
	// (ENAMETOOLONG; 255 bytes on most), which the contract's path schema cannot say.
	NameTooLong Code = "name-too-long"
	// IdempotencyKeyInFlight: the request that first used this Idempotency-Key is still
	// being answered; repeat this one once it is.
	IdempotencyKeyInFlight Code = "idempotency-key-in-flight"
	// SecretNotFound: no secret has this name (it never existed, or was deleted).
	SecretNotFound Code = "secret-not-found"
	// SecretExists: a secret of this name exists; rotate it instead.
	SecretExists Code = "secret-exists"
	// SecretInUse: a sandbox's network policy binds the secret, so it is not deleted.
	SecretInUse Code = "secret-in-use"

	// Volumes (package volume): VolumeNotFound, no volume has the name; VolumeExists, one
	// has it already; VolumeInUse, sandboxes mount it (they are named); VolumeFull, a write
	// went past the volume's size (ENOSPC on its own file system, not the state root's).
	VolumeNotFound Code = "volume-not-found"
	VolumeExists   Code = "volume-exists"
	VolumeInUse    Code = "volume-in-use"
	VolumeFull     Code = "volume-full"
	// CheckpointNotFound: the sandbox has no checkpoint of this name.
	CheckpointNotFound Code = "checkpoint-not-found"
	// CheckpointExists: the sandbox already has a checkpoint of this name.
	CheckpointExists Code = "checkpoint-exists"
	// CheckpointLimit: the sandbox holds as many checkpoints, or as many bytes in them, as
	// the server allows (--checkpoint-max, --checkpoint-max-bytes).
	CheckpointLimit Code = "checkpoint-limit"
	// CheckpointUnsupported: the sandbox's runtime or disk cannot be checkpointed, rolled
	// back or forked (docs/checkpoints.md says which can).
	CheckpointUnsupported Code = "checkpoint-unsupported"

	// RegistryUnavailable: a clone needs a template generation this node does not hold and
	// the template registry it would pull it from cannot be reached (503; clones of
	// generations the node holds go on).
	RegistryUnavailable Code = "registry-unavailable"
	// RegistryRefused: the template registry served a generation that is refused (a digest
	// or size that does not match, an archive entry outside the generation).
	RegistryRefused Code = "registry-refused"

	// StorageFull: the file system of the state root is out of space or over a quota
	// (ENOSPC, EDQUOT). Made by [Storage].
	StorageFull Code = "storage-full"
	// StorageUnavailable: the file system of the state root refuses writes or fails them
	// (EROFS, EIO). Made by [Storage].
	StorageUnavailable Code = "storage-unavailable"

	// NodeFull: a cluster node (bothyd --cluster-node) has no room for the create within the
	// capacity it publishes (slots, memory or CPU limits); a router places it on another
	// node, a client retries after Retry-After.
	NodeFull Code = "node-full"
	// NodeDraining: a cluster node being drained (or cordoned) takes no new sandbox; its
	// own go on until they end or its drain deadline passes.
	NodeDraining Code = "node-draining"
	// NodeNotFound: a cluster router has no BothyNode of the name (GET or PATCH
	// /v1/nodes/{name}).
	NodeNotFound Code = "node-not-found"
	// NotACluster: the nodes API (/v1/nodes) asked of a single bothyd, which is no cluster;
	// a cluster router serves it (docs/cluster.md).
	NotACluster Code = "not-a-cluster"
)

// Error is a domain error with a stable code and a message that tells the caller what to do.
type Error struct {
	Code Code
	// Msg is a full sentence for the caller; it must not leak host paths or internals. The one
	// path it may name is the state root, in a storage fault ([Storage]): the operator who
	// must free or repair it needs to know which file system it is.
	Msg string
	// Field names the request field at fault, for InvalidRequest.
	Field string
	// Err is the underlying cause, kept for logs and errors.Is; never shown to clients.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Msg, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is the same Code, so that errors.Is(err, errcode.SandboxBusy) works
// through any wrapping.
func (e *Error) Is(target error) bool {
	c, ok := target.(Code)
	return ok && c == e.Code
}

// Error makes a Code usable as an errors.Is target.
func (c Code) Error() string { return string(c) }

// New returns an *Error with a message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with a message and an underlying cause.
func Wrap(code Code, err error, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
}

// Invalid returns an InvalidRequest error naming the field at fault.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: InvalidRequest, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Of returns the code of the first *Error in err's chain, or "" if there is none.
func Of(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
