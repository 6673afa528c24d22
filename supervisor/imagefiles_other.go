//go:build !linux

package supervisor

import "errors"

// ImageFilesName is the layer of files bothyd adds to a sandbox on an OCI image.
const ImageFilesName = "imagefiles"

// writeImageFiles exists so that the package builds elsewhere; sandboxes run on Linux only.
func writeImageFiles(dir string, layers []string, cfg ImageConfig, hostname string) error {
	return errors.New("supervisor: images are supported on Linux only")
}
