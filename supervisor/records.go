package supervisor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// The supervisor's own small records in a state directory (paused.json, lifetime.json, the
// create's pending mark) are read and removed by these two, so that each is read bounded and
// by its format, and each removal is durable.

// readOwnRecord decodes the record name of dir, of format, into v; found is false, with no
// error, when there is none.
func readOwnRecord(dir, name string, format int, v any) (found bool, err error) {
	data, err := platform.ReadFile(filepath.Join(dir, name), record.MaxSize)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, record.Decode(name, data, format, v)
}

// removeOwnRecord removes the entry name of dir durably; none is not an error.
func removeOwnRecord(dir, name string) error {
	err := os.Remove(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return platform.SyncDirPath(dir)
}
