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
	CodePermissionDenied  = string(errcode.PermissionDenied)
	CodeNotADirectory     = string(errcode.NotADirectory)
	CodeIsADirectory      = string(errcode.IsADirectory)
	CodeNotRegular        = string(errcode.NotARegularFile)
	CodeDirectoryNotEmpty = string(errcode.DirectoryNotEmpty)
	CodeFileExists        = string(errcode.FileExists)
	CodeSymlinkLoop       = string(errcode.SymlinkLoop)
	CodeNameTooLong       = string(errcode.NameTooLong)
	CodeMountInside       = string(errcode.MountInside)
	CodeCommandNotFound   = "command-not-found"
	// CodeNotExecutable: the command was found but cannot be executed by the user (EACCES,
	// ENOEXEC at execve). The server answers it as a shell does, with exit status 126.
	CodeNotExecutable = "not-executable"
	// CodePidsLimit: a command could not start, the sandbox's processes being at its pids
	// limit (the fork's EAGAIN).
	CodePidsLimit = string(errcode.PidsLimit)
	// CodeNoSpace: the file system the sandbox wrote to is full or over a quota (ENOSPC,
	// EDQUOT). The server says whose disk that is: the sandbox's own, or the state root's.
	CodeNoSpace = "no-space"
	// CodeFileChanged: the file changed under the operation: it shrank while it was read
	// (which ends the read part way), or a tree was moved while it was removed.
	CodeFileChanged = string(errcode.FileChanged)
	// CodeLimitReached: the sandbox tracks as many processes as it may.
	CodeLimitReached     = string(errcode.LimitReached)
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

// ErrCode maps the agent's code to the errcode the API reports. The refusals the sandbox's
// files make (a missing file, a directory where a file was meant, a permission the user
// lacks) keep their own codes: the request was valid by the contract, and the server answers
// them with their own statuses, not invalid-request's 400. A full file system is
// StorageFull; anything unknown is Internal.
func (e *RemoteError) ErrCode() errcode.Code {
	switch e.Code {
	case CodeFileNotFound, CodePermissionDenied, CodeNotADirectory, CodeIsADirectory,
		CodeNotRegular, CodeDirectoryNotEmpty, CodeFileExists, CodeSymlinkLoop,
		CodeNameTooLong, CodeMountInside, CodeFileChanged, CodePidsLimit, CodeLimitReached:
		return errcode.Code(e.Code)
	case CodeInvalidRequest, CodeCommandNotFound, CodeNotExecutable:
		// A command that is not found or not executable is answered as an exit status
		// (127, 126) by the supervisor; here only as a last resort.
		return errcode.InvalidRequest
	case CodeUnauthorized:
		return errcode.Unauthorized
	case CodeShuttingDown:
		return errcode.NotRunning
	case CodeNoSpace:
		return errcode.StorageFull
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

// ErrShuttingDown is the refusal of a command or operation that reaches an agent after its
// shutdown: sent by the agent on a stream opened just before, and made by the client when
// the session refuses a new stream.
var ErrShuttingDown = &RemoteError{Code: CodeShuttingDown, Message: "The sandbox is shutting down; no new command or operation can start."}

// ErrShutdown is returned by Serve after it answered a shutdown request: the agent must now
// exit.
var ErrShutdown = errors.New("control: the agent was asked to shut down")

// ErrUnauthorized is returned by Serve when the client's hello carried the wrong capability or
// the client skipped hello.
var ErrUnauthorized = errors.New("control: the client did not authenticate")
