package control

import (
	"errors"
	"fmt"

	"github.com/bothy/bothy/errcode"
)

// The codes an agent puts into an error frame. Those that name the same condition as an
// errcode.Code use the same string.
const (
	CodeInvalidRequest    = string(errcode.InvalidRequest)
	CodeFileNotFound      = string(errcode.FileNotFound)
	CodePermissionDenied  = "permission-denied"
	CodeNotADirectory     = "not-a-directory"
	CodeIsADirectory      = "is-a-directory"
	CodeNotRegular        = "not-a-regular-file"
	CodeDirectoryNotEmpty = "directory-not-empty"
	CodeFileExists        = "file-exists"
	CodeCommandNotFound   = "command-not-found"
	// CodePidsLimit: a command could not start, the sandbox's processes being at its pids
	// limit (the fork's EAGAIN).
	CodePidsLimit = string(errcode.PidsLimit)
	// CodeNoSpace: the file system the sandbox wrote to is full or over a quota (ENOSPC,
	// EDQUOT). The server says whose disk that is: the sandbox's own, or the state root's.
	CodeNoSpace = "no-space"
	// CodeFileChanged ends a read part way: the file shrank while it was read.
	CodeFileChanged      = "file-changed"
	CodeUnauthorized     = string(errcode.Unauthorized)
	CodeProtocolMismatch = "protocol-mismatch"
	CodeShuttingDown     = "shutting-down"
	CodeInternal         = string(errcode.Internal)
)

// RemoteError is an error the agent reported in an error frame. The client returns it wrapped
// in an *errcode.Error (see Err), so errors.Is(err, errcode.FileNotFound) and errcode.Of work,
// and errors.As(err, &remote) still reaches the agent's precise code.
type RemoteError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *RemoteError) Error() string { return fmt.Sprintf("agent: %s: %s", e.Code, e.Message) }

// ErrCode maps the agent's code to the errcode the API reports: a missing file is
// FileNotFound, a request the sandbox's state or the user's permissions refuse is
// InvalidRequest (the message says why), a full file system is StorageFull, anything else is
// Internal.
func (e *RemoteError) ErrCode() errcode.Code {
	switch e.Code {
	case CodeFileNotFound:
		return errcode.FileNotFound
	case CodeInvalidRequest, CodePermissionDenied, CodeNotADirectory, CodeIsADirectory,
		CodeNotRegular, CodeDirectoryNotEmpty, CodeFileExists, CodeCommandNotFound:
		return errcode.InvalidRequest
	case CodeUnauthorized:
		return errcode.Unauthorized
	case CodeShuttingDown:
		return errcode.NotRunning
	case CodeNoSpace:
		return errcode.StorageFull
	case CodePidsLimit:
		return errcode.PidsLimit
	case CodePortRefused:
		return errcode.PortUnreachable
	}
	return errcode.Internal
}

// Err wraps the remote error into the *errcode.Error callers above the supervisor expect.
func (e *RemoteError) Err() error {
	return &errcode.Error{Code: e.ErrCode(), Msg: e.Message, Err: e}
}

// asRemote turns an error of a Handler into what goes into an error frame: a RemoteError is
// sent as it is; anything else becomes an internal error whose text is kept for the agent's
// log only, because it may name paths or internals.
func asRemote(err error) *RemoteError {
	var re *RemoteError
	if errors.As(err, &re) {
		return re
	}
	return &RemoteError{Code: CodeInternal, Message: "The agent failed to carry out the request; see the sandbox log."}
}

// ErrShutdown is returned by Serve after it answered a shutdown request: the agent must now
// exit.
var ErrShutdown = errors.New("control: the agent was asked to shut down")

// ErrUnauthorized is returned by Serve when the client's hello carried the wrong capability or
// the client skipped hello.
var ErrUnauthorized = errors.New("control: the client did not authenticate")
