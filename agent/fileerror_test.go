package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/platform"
)

// TestFileErrorCodes: each errno a file operation meets becomes the code of its own that the
// server answers with its own status (never invalid-request: the request was valid, the
// sandbox's files refused it), including the two a recursive removal makes itself.
func TestFileErrorCodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  error
		code string
	}{
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, control.CodeFileNotFound},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, control.CodePermissionDenied},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.EPERM}, control.CodePermissionDenied},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.EROFS}, control.CodePermissionDenied},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOTDIR}, control.CodeNotADirectory},
		{syscall.EISDIR, control.CodeIsADirectory},
		{&fs.PathError{Op: "rmdir", Path: "/x", Err: syscall.ENOTEMPTY}, control.CodeDirectoryNotEmpty},
		{&fs.PathError{Op: "mkdir", Path: "/x", Err: syscall.EEXIST}, control.CodeFileExists},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ELOOP}, control.CodeSymlinkLoop},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENAMETOOLONG}, control.CodeNameTooLong},
		{&fs.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, control.CodeNoSpace},
		{fmt.Errorf("removing: %w", platform.ErrOtherDevice), control.CodeMountInside},
		{fmt.Errorf("removing: %w", platform.ErrTreeChanged), control.CodeFileChanged},
	}
	for _, tc := range cases {
		var re *control.RemoteError
		if err := fileError(tc.err, "/x"); !errors.As(err, &re) || re.Code != tc.code || re.Message == "" {
			t.Errorf("fileError(%v) = %v, want %s with a message", tc.err, err, tc.code)
		}
	}
}
