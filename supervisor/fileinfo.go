package supervisor

import (
	"context"
	"io/fs"
)

// StatFile describes the file at path as user sees it (a symlink itself, not its target),
// with its details. Like the other file operations it takes no lock.
func (s *Supervisor) StatFile(ctx context.Context, id, path, user string) (FileInfo, error) {
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return FileInfo{}, err
	}
	fi, err := agent.StatDetails(ctx, path, user)
	if err != nil {
		return FileInfo{}, err
	}
	return fileInfoOf(fi), nil
}

// MakeDir creates a directory as user (mode 0 means 0755); with parents it creates the
// missing parents too, and an existing directory is not an error.
func (s *Supervisor) MakeDir(ctx context.Context, id, path, user string, mode fs.FileMode, parents bool) error {
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return err
	}
	return agent.Mkdir(ctx, path, user, mode, parents)
}
