//go:build !linux

package platform

import "os"

// OverlayLayers says how NewOverlay hands overlayfs its layers (mounttree_linux.go).
type OverlayLayers string

const (
	OverlayLayersByFD   OverlayLayers = "descriptors"
	OverlayLayersByPath OverlayLayers = "paths"
)

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

func NewMount(fstype, source, options string, attrs int) (*os.File, error) {
	return nil, ErrUnsupported
}
func NewOverlay(how OverlayLayers, lowers []*os.File, upper, work *os.File, options string, attrs int) (*os.File, error) {
	return nil, ErrUnsupported
}
func CloneMount(dir *os.File, p string, recursive bool) (*os.File, error) { return nil, ErrUnsupported }
func SetMountAttrs(m *os.File, attrs uint64, recursive bool) error        { return ErrUnsupported }
func AttachMount(m, target *os.File) error                                { return ErrUnsupported }
func AttachMountAt(m *os.File, target string) error                       { return ErrUnsupported }
func AttachMountOnCwd(m *os.File) error                                   { return ErrUnsupported }
func WithMountsAttached(mounts []*os.File, target string, fn func() error) error {
	return ErrUnsupported
}
