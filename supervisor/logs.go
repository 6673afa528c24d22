package supervisor

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/bothy/bothy/platform"
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

// logTail is the last lines of a log's human lines ([humanLines]), for error messages; it
// never fails.
func (s *Supervisor) logTail(dir string, lines int) string {
	b, err := readLogTail(dir, 0)
	if err != nil {
		return "(no log)"
	}
	kept := humanLines(b)
	if len(kept) > lines {
		kept = kept[len(kept)-lines:]
	}
	if len(kept) == 0 {
		return "(nothing but a Go traceback; GET the sandbox's logs for all of it)\n"
	}
	return strings.Join(kept, "\n") + "\n"
}

// humanLines returns the lines of a sandbox log that a person wrote for a person: those that
// begin with a timestamp (the shim's and the agent's log lines) and the headline of a Go
// crash (panic:, fatal error:, and the runtime's own runtime: messages). A crash's goroutine
// dump, its frames, file positions and "created by" lines, is left out: a problem's detail
// is read by the API's callers, for whom it is noise about bothyd's internals; the log
// endpoint still serves all of it.
func humanLines(b []byte) []string {
	var kept []string
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case line == "":
		case line[0] >= '0' && line[0] <= '9',
			strings.HasPrefix(line, "panic: "),
			strings.HasPrefix(line, "fatal error: "),
			strings.HasPrefix(line, "runtime: "):
			kept = append(kept, line)
		}
	}
	return kept
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
