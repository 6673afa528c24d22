package supervisor

import (
	"context"
	"io"
	"io/fs"
	"time"

	"github.com/bothy/bothy/control"
)

// The file operations below act inside a running sandbox, through its agent, as the user
// the caller names: the sandbox's own permissions apply. Paths are absolute paths inside the
// sandbox. They take no lock (see runningAgent): a sandbox that stops under one fails it,
// with not-running (control.ErrClosed).

// FileType is the type of a directory entry.
type FileType string

// The types of [FileInfo].
const (
	FileRegular FileType = FileType(control.TypeFile)
	FileDir     FileType = FileType(control.TypeDir)
	FileSymlink FileType = FileType(control.TypeSymlink)
	FileOther   FileType = FileType(control.TypeOther)
)

// FileInfo describes a directory entry.
type FileInfo struct {
	Name string
	Type FileType
	Size int64
	// Mode is the permission bits, with setuid, setgid and sticky as stat(2) has them
	// (0o4000, 0o2000, 0o1000), not as fs.FileMode does.
	Mode       uint32
	ModifiedAt time.Time
	// The details, from StatFile and ListFileDetails only (an agent of an older bothyd
	// answers none): owner and group names as the sandbox's /etc/passwd and /etc/group say
	// (else the numbers); for a symlink the path it resolves to and the type and mode of
	// what is there (see control.FileInfo); the user metadata stored by WriteFile.
	Owner, Group, Target string
	TargetType           FileType
	TargetMode           uint32
	Metadata             map[string]string
}

func fileInfoOf(fi control.FileInfo) FileInfo {
	return FileInfo{Name: fi.Name, Type: FileType(fi.Type), Size: fi.Size, Mode: fi.Mode, ModifiedAt: fi.ModifiedAt,
		Owner: fi.Owner, Group: fi.Group, Target: fi.Target, TargetType: FileType(fi.TargetType), TargetMode: fi.TargetMode,
		Metadata: fi.Metadata}
}

// WriteRequest says where and how [Supervisor.WriteFile] stores a file.
type WriteRequest struct {
	Path string
	User string
	// Mode is the new file's permission bits; 0 means 0644.
	Mode fs.FileMode
	// MakeParents creates missing parent directories (mode 0755, owned by User).
	MakeParents bool
	// Metadata is the user metadata stored with the file (control.ValidateMetadata says
	// what it may hold), as extended attributes inside the sandbox.
	Metadata map[string]string
}

// ListFiles lists a directory.
func (s *Supervisor) ListFiles(ctx context.Context, id, path, user string) ([]FileInfo, error) {
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	infos, err := agent.List(ctx, path, user)
	if err != nil {
		return nil, err
	}
	out := make([]FileInfo, len(infos))
	for i, fi := range infos {
		out[i] = fileInfoOf(fi)
	}
	return out, nil
}

// ListFileDetails lists a directory with each entry's details, at most limit (1 to
// control.MaxListLimit) entries.
func (s *Supervisor) ListFileDetails(ctx context.Context, id, path, user string, limit int) ([]FileInfo, error) {
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	infos, _, err := agent.ListDetails(ctx, path, user, limit)
	if err != nil {
		return nil, err
	}
	out := make([]FileInfo, len(infos))
	for i, fi := range infos {
		out[i] = fileInfoOf(fi)
	}
	return out, nil
}

// ReadFile opens a file for reading, and returns its size: that of the file the agent opened,
// so that a file renamed over meanwhile cannot make the two disagree; -1 for a file whose
// size says nothing of its content (those of /proc and /sys), read until its end. The reader
// belongs to ctx, which must outlive it; the caller closes it.
func (s *Supervisor) ReadFile(ctx context.Context, id, path, user string) (io.ReadCloser, int64, error) {
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	return agent.ReadFile(ctx, path, user)
}

// WriteFile streams r into a file, which holds either its old or its complete new content
// at any time, and returns the size written.
func (s *Supervisor) WriteFile(ctx context.Context, id string, req WriteRequest, r io.Reader) (int64, error) {
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return 0, err
	}
	n, err := agent.WriteFile(ctx, control.WriteRequest{Path: req.Path, User: req.User, Mode: req.Mode, MakeParents: req.MakeParents, Metadata: req.Metadata}, r)
	return n, s.diskFullErr(id, req.Path, req.User, err)
}

// RemoveFile removes a file, or with recursive a directory and what it holds.
func (s *Supervisor) RemoveFile(ctx context.Context, id, path, user string, recursive bool) error {
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return err
	}
	return agent.Remove(ctx, path, user, recursive)
}
