package supervisor

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/platform"
)

// maxLogRead bounds how much of a log is read to find its last lines.
const maxLogRead = 4 << 20

// Logs returns the last tail lines of a sandbox's log (agent and runtime output); tail <= 0
// means all of the last maxLogRead bytes.
func (s *Supervisor) Logs(id string, tail int) ([]byte, error) {
	// Only whether the sandbox exists matters here, not its state.
	if _, err := s.store.ReadConfigUnlocked(id); err != nil {
		return nil, err
	}
	dir, err := s.store.Dir(id)
	if err != nil {
		return nil, err
	}
	b, err := readLogTail(dir, tail)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // never started: an empty log
	}
	return b, err
}

// logTail is the tail of a log for error messages; it never fails.
func (s *Supervisor) logTail(dir string, lines int) string {
	b, err := readLogTail(dir, lines)
	if err != nil {
		return "(no log)"
	}
	return string(b)
}

func readLogTail(dir string, lines int) ([]byte, error) {
	f, err := platform.OpenFile(filepath.Join(dir, LogName), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	off := max(size-maxLogRead, 0)
	b := make([]byte, size-off)
	if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
		return nil, err
	}
	if off > 0 {
		// Drop the partial first line.
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	if lines > 0 {
		n := 0
		for i := len(bytes.TrimSuffix(b, []byte("\n"))) - 1; i >= 0; i-- {
			if b[i] == '\n' {
				n++
				if n == lines {
					return b[i+1:], nil
				}
			}
		}
	}
	return b, nil
}
