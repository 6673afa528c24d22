//go:build !linux

package volume

import (
	"context"
	"io"

	"github.com/bothy/bothy/platform"
)

// Volumes are loop-mounted ext4 images (see the package doc): Linux alone has them. The
// stubs let the packages that use a Store build elsewhere.

type HeldBy func(sandboxID, name string) bool

type Store struct{}

type Problem struct{ Kind, Entry, Detail string }

const Dir = "volumes"

func Open(root string) (*Store, error)                 { return nil, platform.ErrUnsupported }
func (s *Store) SetHeldBy(HeldBy)                      {}
func (s *Store) SetOnChange(func(change, name string)) {}
func (s *Store) Dir() string                           { return "" }
func (s *Store) Create(context.Context, string, int) (*Volume, error) {
	return nil, platform.ErrUnsupported
}
func (s *Store) Get(string) (*Volume, error)             { return nil, platform.ErrUnsupported }
func (s *Store) List() ([]*Volume, error)                { return nil, platform.ErrUnsupported }
func (s *Store) Delete(string) error                     { return platform.ErrUnsupported }
func (s *Store) Hold(string, []string) error             { return platform.ErrUnsupported }
func (s *Store) Release(string, []string) error          { return platform.ErrUnsupported }
func (s *Store) Source(string) (string, error)           { return "", platform.ErrUnsupported }
func (s *Store) Recover() error                          { return platform.ErrUnsupported }
func (s *Store) Check(bool) ([]Problem, error)           { return nil, platform.ErrUnsupported }
func (s *Store) Stat(string, string) (*Entry, error)     { return nil, platform.ErrUnsupported }
func (s *Store) ListDir(string, string) ([]Entry, error) { return nil, platform.ErrUnsupported }
func (s *Store) Open(string, string) (io.ReadCloser, int64, error) {
	return nil, 0, platform.ErrUnsupported
}
func (s *Store) Mkdir(string, string, WriteOptions) (*Entry, error) {
	return nil, platform.ErrUnsupported
}
func (s *Store) Write(string, string, io.Reader, WriteOptions) (*Entry, error) {
	return nil, platform.ErrUnsupported
}
func (s *Store) Remove(string, string, bool) error { return platform.ErrUnsupported }
