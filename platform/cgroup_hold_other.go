//go:build !linux

package platform

// This stub exists so that the module builds on other systems; bothyd runs only on Linux.

// HoldCgroup is unsupported off Linux.
func HoldCgroup(leaf string, controllers []string) (string, []string, error) {
	return "", nil, ErrUnsupported
}
