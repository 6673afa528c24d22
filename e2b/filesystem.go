package e2b

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/e2b/envd/filesystem"
	"github.com/bothy/bothy/e2b/envd/filesystem/filesystemconnect"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// maxListDepth bounds ListDir's recursion, and maxListEntries its answer.
const (
	maxListDepth   = 16
	maxListEntries = 10000
)

// filesystemService implements envd's filesystem service over the supervisor's file
// operations. The user is the Authorization header's (envd's basic auth, user name alone),
// else the default user.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	h *Handler
}

// userOfHeader reads envd's user from its basic authentication: "user:" in base64.
func userOfHeader(h interface{ Get(string) string }) string {
	if u, _, ok := parseBasic(h.Get("Authorization")); ok && u != "" {
		return u
	}
	return defaultUser
}

func entryOf(dir string, fi supervisor.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name:         fi.Name,
		Path:         path.Join(dir, fi.Name),
		Size:         fi.Size,
		Mode:         fi.Mode & 0o7777,
		Permissions:  permissions(fi.Type, fi.Mode),
		ModifiedTime: timestamppb.New(fi.ModifiedAt),
		Owner:        fi.Owner,
		Group:        fi.Group,
		Metadata:     fi.Metadata,
	}
	e.Type = fileType(fi.Type)
	if fi.Type == supervisor.FileDir {
		e.Mode |= uint32(fs.ModeDir)
	}
	if fi.Type == supervisor.FileSymlink && fi.Target != "" {
		// As envd: a link is described by what it resolves to (its path, type and mode), or
		// has no type where it resolves nowhere; its permissions stay the link's own.
		e.SymlinkTarget = &fi.Target
		e.Type, e.Mode = fileType(fi.TargetType), fi.TargetMode&0o7777
		if fi.TargetType == supervisor.FileDir {
			e.Mode |= uint32(fs.ModeDir)
		}
	}
	return e
}

// fileType is envd's type of an entry: what is neither file, directory nor link (a FIFO,
// a device, a link's target that is not there) has none.
func fileType(t supervisor.FileType) filesystem.FileType {
	switch t {
	case supervisor.FileRegular:
		return filesystem.FileType_FILE_TYPE_FILE
	case supervisor.FileDir:
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case supervisor.FileSymlink:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED
}

// permissions spells a mode as ls -l does.
func permissions(t supervisor.FileType, mode uint32) string {
	m := fs.FileMode(mode & 0o777)
	switch t {
	case supervisor.FileDir:
		m |= fs.ModeDir
	case supervisor.FileSymlink:
		m |= fs.ModeSymlink
	}
	return m.String()
}

// homeOf is a sandbox user's home, as the agent gives it (agent/config.go): bothyd's
// sandboxes have two users, "user" and "root".
func homeOf(user string) string {
	if user == control.Root {
		return "/root"
	}
	return "/home/user"
}

// resolvePath makes p absolute as envd does (its permissions.ExpandAndResolve): "~" and
// "~/..." are the user's home and below it, a relative path is taken from the home, and an
// empty one is the home itself; the result is clean. "~name" (another user's home) is refused,
// as envd refuses it.
func resolvePath(p, user string) (string, error) {
	if strings.HasPrefix(p, "~") {
		if len(p) > 1 && p[1] != '/' {
			return "", fmt.Errorf("the path %q names another user's home; write it from / or from this user's home", p)
		}
		p = homeOf(user) + p[1:]
	}
	if !path.IsAbs(p) {
		p = path.Join(homeOf(user), p)
	}
	return path.Clean(p), nil
}

// resolveArg is resolvePath for a call's argument, in place: a refusal is invalid_argument.
func resolveArg(p *string, user string) error {
	abs, err := resolvePath(*p, user)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	*p = abs
	return nil
}

func (s *filesystemService) stat(ctx context.Context, id, p, user string) (*filesystem.EntryInfo, error) {
	fi, err := s.h.sup.StatFile(ctx, id, path.Clean(p), user)
	if err != nil {
		return nil, connectError(err)
	}
	return entryOf(path.Dir(path.Clean(p)), fi), nil
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	if err := resolveArg(&req.Msg.Path, userOfHeader(req.Header())); err != nil {
		return nil, err
	}
	e, err := s.stat(ctx, sandboxOf(ctx), req.Msg.Path, userOfHeader(req.Header()))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory with its parents; one that exists is already_exists, which the
// SDKs answer as false.
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	if err := resolveArg(&req.Msg.Path, userOfHeader(req.Header())); err != nil {
		return nil, err
	}
	p := req.Msg.Path
	id, user := sandboxOf(ctx), userOfHeader(req.Header())
	if fi, err := s.h.sup.StatFile(ctx, id, path.Clean(p), user); err == nil {
		if fi.Type != supervisor.FileDir {
			// As envd answers it: not a directory that is there already, but a path in the way.
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s exists already and is not a directory", p))
		}
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s exists already", p))
	}
	if err := s.h.sup.MakeDir(ctx, id, path.Clean(p), user, 0o755, true); err != nil {
		return nil, connectError(err)
	}
	e, err := s.stat(ctx, id, p, user)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination by running mv as the user: the agent has no rename
// of its own, and mv is in every image bothyd runs E2B's SDKs against.
func (s *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	if err := resolveArg(&req.Msg.Source, userOfHeader(req.Header())); err != nil {
		return nil, err
	}
	if err := resolveArg(&req.Msg.Destination, userOfHeader(req.Header())); err != nil {
		return nil, err
	}
	src, dst := req.Msg.Source, req.Msg.Destination
	id, user := sandboxOf(ctx), userOfHeader(req.Header())
	if _, err := s.h.sup.StatFile(ctx, id, path.Clean(src), user); err != nil {
		return nil, connectError(err)
	}
	out, code, err := s.h.runQuiet(ctx, id, supervisor.ExecRequest{Argv: []string{"mv", "-T", "--", src, dst}, User: user, Timeout: time.Minute})
	if err != nil {
		return nil, connectError(err)
	}
	if code != 0 {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("moving %s to %s failed: %s", src, dst, out))
	}
	e, err := s.stat(ctx, id, dst, user)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// ListDir lists a directory to depth levels (0 and 1: its own entries).
func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	if err := resolveArg(&req.Msg.Path, userOfHeader(req.Header())); err != nil {
		return nil, err
	}
	p := req.Msg.Path
	depth := int(max(req.Msg.Depth, 1))
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the depth %d is more than %d", depth, maxListDepth))
	}
	id, user := sandboxOf(ctx), userOfHeader(req.Header())
	st, err := s.h.sup.StatFile(ctx, id, path.Clean(p), user)
	if err != nil {
		return nil, connectError(err)
	}
	// A symbolic link is listed as what it points to, as envd follows it: a directory's
	// entries, a refusal of what it is not (a file: invalid_argument; a loop:
	// failed_precondition).
	if st.Type != supervisor.FileDir && st.Type != supervisor.FileSymlink {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", p))
	}
	var out []*filesystem.EntryInfo
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		if len(out) >= maxListEntries {
			return nil
		}
		infos, err := s.h.sup.ListFileDetails(ctx, id, dir, user, maxListEntries-len(out))
		if err != nil {
			return err
		}
		for _, fi := range infos {
			if len(out) == maxListEntries {
				return nil
			}
			out = append(out, entryOf(dir, fi))
			if fi.Type == supervisor.FileDir && level < depth {
				if err := walk(path.Join(dir, fi.Name), level+1); err != nil && errcode.Of(err) != errcode.FileNotFound {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(path.Clean(p), 1); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: out}), nil
}

func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	if err := resolveArg(&req.Msg.Path, userOfHeader(req.Header())); err != nil {
		return nil, err
	}
	if err := s.h.sup.RemoveFile(ctx, sandboxOf(ctx), path.Clean(req.Msg.Path), userOfHeader(req.Header()), true); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
