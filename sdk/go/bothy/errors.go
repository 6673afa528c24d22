package bothy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi/client"
)

// Code is a problem's stable code. A Code is an error so that errors.Is(err, ErrX) matches an
// [*APIError] with that code.
type Code string

func (c Code) Error() string { return "bothyd: " + string(c) }

// The codes of the contract (openapi.yaml's ErrorCode, the same as package errcode's), and
// those of operations newer than this package. The contract's list is open: a newer server
// may send a code that is none of these, and callers treat it by its HTTP status.
var (
	ErrAlreadyProvisioned   = Code(errcode.AlreadyProvisioned)
	ErrAlreadyRunning       = Code(errcode.AlreadyRunning)
	ErrFileNotFound         = Code(errcode.FileNotFound)
	ErrForbidden            = Code(errcode.Forbidden)
	ErrForeignFiles         = Code(errcode.ForeignFiles)
	ErrGenerationLeased     = Code(errcode.GenerationLeased)
	ErrGenerationNotFound   = Code(errcode.GenerationNotFound)
	ErrImageInUse           = Code(errcode.ImageInUse)
	ErrImageNotFound        = Code(errcode.ImageNotFound)
	ErrInternal             = Code(errcode.Internal)
	ErrInvalidRequest       = Code(errcode.InvalidRequest)
	ErrMethodNotAllowed     = Code(errcode.MethodNotAllowed)
	ErrNotFound             = Code(errcode.NotFound)
	ErrNotImplemented       = Code(errcode.NotImplemented)
	ErrNotRunning           = Code(errcode.NotRunning)
	ErrPayloadTooLarge      = Code(errcode.PayloadTooLarge)
	ErrProvisionedAgain     = Code(errcode.ProvisionedAgain)
	ErrRuntimeMismatch      = Code(errcode.RuntimeMismatch)
	ErrSandboxBusy          = Code(errcode.SandboxBusy)
	ErrSandboxLaunched      = Code(errcode.SandboxLaunched)
	ErrSandboxLeased        = Code(errcode.SandboxLeased)
	ErrSandboxNotFound      = Code(errcode.SandboxNotFound)
	ErrStartTimeout         = Code(errcode.StartTimeout)
	ErrStopTimeout          = Code(errcode.StopTimeout)
	ErrStorageFull          = Code(errcode.StorageFull)
	ErrStorageUnavailable   = Code(errcode.StorageUnavailable)
	ErrTemplateExists       = Code(errcode.TemplateExists)
	ErrTemplateIneligible   = Code(errcode.TemplateIneligible)
	ErrTemplateNotFound     = Code(errcode.TemplateNotFound)
	ErrTemplateTombstoned   = Code(errcode.TemplateTombstoned)
	ErrTransitionInProgress = Code(errcode.TransitionInProgress)
	ErrUnauthorized         = Code(errcode.Unauthorized)
	ErrUnavailable          = Code(errcode.Unavailable)
	ErrSandboxPaused        = Code(errcode.SandboxPaused)
	ErrSandboxWaking        = Code(errcode.SandboxWaking)
	ErrWaitTimeout          = Code(errcode.WaitTimeout)
	ErrWebhookNotFound      = Code(errcode.WebhookNotFound)
	// ErrLinkNotFound: no live port link has the id (it expired, was revoked, or never was).
	ErrLinkNotFound = Code(errcode.LinkNotFound)
	// Volumes: no volume has the name; one has it already; sandboxes mount it (named in the
	// detail); a write went past its size.
	ErrVolumeNotFound = Code(errcode.VolumeNotFound)
	ErrVolumeExists   = Code(errcode.VolumeExists)
	ErrVolumeInUse    = Code(errcode.VolumeInUse)
	ErrVolumeFull     = Code(errcode.VolumeFull)
	// ErrIdempotencyKeyReused: the Idempotency-Key was first used with another request.
	ErrIdempotencyKeyReused = Code(errcode.IdempotencyKeyReused)
	// ErrIdempotencyKeyInFlight: the first request with the Idempotency-Key still runs;
	// repeat in a moment.
	ErrIdempotencyKeyInFlight = Code(errcode.IdempotencyKeyInFlight)
	// ErrNodeFull and ErrNodeDraining: a cluster node refused a create, having no room
	// within its published capacity, or being drained; retry (through a router, which
	// places it elsewhere).
	ErrNodeFull     = Code(errcode.NodeFull)
	ErrNodeDraining = Code(errcode.NodeDraining)
	// ErrNodeNotFound: a cluster router has no node of the name.
	ErrNodeNotFound = Code(errcode.NodeNotFound)
	// ErrNotACluster: the nodes API asked of a single bothyd; call the cluster's router.
	ErrNotACluster = Code(errcode.NotACluster)
	// ErrRegistryUnavailable and ErrRegistryRefused: a clone needed a template generation
	// from the template registry, which could not be reached, or served one that was refused
	// (a digest or a bound that did not hold); retry, or clone a generation the node holds.
	ErrRegistryUnavailable = Code(errcode.RegistryUnavailable)
	ErrRegistryRefused     = Code(errcode.RegistryRefused)
	// A cluster router's own (docs/cluster.md): the sandbox's or volume's node's lease has
	// lapsed, retry once it is back (503, Retry-After); no node can take the create (503);
	// the create mounts volumes of two nodes, and a sandbox runs on one (409).
	ErrNodeLost        = Code("node-lost")
	ErrNoNodeAvailable = Code("no-node-available")
	ErrVolumesApart    = Code("volumes-apart")

	// The refusals of a sandbox's files, for a request the contract takes (APIError.Field
	// names the path's field, "path" or an exec's "cwd"); the same request may succeed once
	// the files change.
	ErrPermissionDenied  = Code(errcode.PermissionDenied)  // 403: the user may not
	ErrNotADirectory     = Code(errcode.NotADirectory)     // 409
	ErrIsADirectory      = Code(errcode.IsADirectory)      // 409: list it instead
	ErrNotARegularFile   = Code(errcode.NotARegularFile)   // 409: a FIFO, device or socket
	ErrDirectoryNotEmpty = Code(errcode.DirectoryNotEmpty) // 409: remove with recursive
	ErrFileExists        = Code(errcode.FileExists)        // 409
	ErrSymlinkLoop       = Code(errcode.SymlinkLoop)       // 409
	ErrMountInside       = Code(errcode.MountInside)       // 409
	ErrFileChanged       = Code(errcode.FileChanged)       // 409: repeat the request
	ErrNameTooLong       = Code(errcode.NameTooLong)       // 422
	// The checkpoints' codes (docs/checkpoints.md).
	ErrCheckpointNotFound    = Code(errcode.CheckpointNotFound)
	ErrCheckpointExists      = Code(errcode.CheckpointExists)
	ErrCheckpointLimit       = Code(errcode.CheckpointLimit)
	ErrCheckpointUnsupported = Code(errcode.CheckpointUnsupported)
	// ErrSecretNotFound: no secret has the name.
	ErrSecretNotFound = Code(errcode.SecretNotFound)
	// ErrSecretExists: a secret of the name exists; rotate it instead.
	ErrSecretExists = Code(errcode.SecretExists)
	// ErrSecretInUse: a sandbox's network policy binds the secret.
	ErrSecretInUse = Code(errcode.SecretInUse)
)

// APIError is an answer that was not a success: the problem+json the server sent, or what
// could be made of a body that was not one.
type APIError struct {
	Status    int
	Code      Code
	Detail    string
	Field     string
	RequestID string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("%s (HTTP %d)", e.Detail, e.Status)
	}
	return fmt.Sprintf("%s (%s, HTTP %d)", e.Detail, string(e.Code), e.Status)
}

// Is matches a [Code] equal to the error's.
func (e *APIError) Is(target error) bool {
	c, ok := target.(Code)
	return ok && c == e.Code
}

// IsCode reports whether err is an [*APIError] with code c.
func IsCode(err error, c Code) bool { return errors.Is(err, c) }

// IsUnsupported reports whether err says that the server does not have the operation: an
// older server answers an unknown route with not-found or method-not-allowed, and one that
// has the route but not the operation with not-implemented.
func IsUnsupported(err error) bool {
	return IsCode(err, ErrNotFound) || IsCode(err, ErrMethodNotAllowed) || IsCode(err, ErrNotImplemented)
}

// readProblem reads a failed answer's body as a problem.
func readProblem(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return problemOf(resp.StatusCode, body)
}

// ProblemOf is the [*APIError] of a failed answer with this status and body (a problem+json
// document, or whatever the server sent), for callers that reach a route themselves, such as
// a websocket dial's refusal.
func ProblemOf(status int, body []byte) error { return problemOf(status, body) }

func problemOf(status int, body []byte) error {
	var p client.Problem
	if json.Unmarshal(body, &p) != nil || p.Code == "" {
		detail := strings.TrimSpace(string(body))
		if detail == "" {
			detail = http.StatusText(status)
		}
		return &APIError{Status: status, Detail: detail}
	}
	e := &APIError{Status: status, Code: Code(p.Code), Detail: p.Detail}
	if p.Field != nil {
		e.Field = *p.Field
	}
	if p.RequestID != nil {
		e.RequestID = *p.RequestID
	}
	return e
}

// ErrUnreachable is matched by an [*UnreachableError].
var ErrUnreachable = errors.New("bothyd cannot be reached")

// UnreachableError is a request that no server answered: nothing listens at the URL, or the
// connection failed before an answer.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("bothyd cannot be reached at %s: %v", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Is matches [ErrUnreachable].
func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }

// transportError marks a failure to connect as an [*UnreachableError]; other failures (a
// cancelled context, a connection cut mid-answer) stay as they are.
func (c *Client) transportError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &UnreachableError{URL: c.base.String(), Err: err}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return &UnreachableError{URL: c.base.String(), Err: err}
	}
	return err
}
