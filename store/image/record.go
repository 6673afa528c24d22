package image

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// The record formats this version reads and writes.
const (
	imageFormat = 1
	layerFormat = 1
	refExt      = ".json"
)

// Config is the part of an image's configuration that bothyd honours or shows: Env,
// WorkingDir and User are the defaults of every exec; Entrypoint and Cmd are shown, not run.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Image is the record of one image, refs/<name>.json: what a sandbox on it stacks and runs.
type Image struct {
	Format int    `json:"format"`
	Name   string `json:"name"`
	// Ref is the reference it was pulled by; empty for an import.
	Ref            string `json:"ref,omitempty"`
	ManifestDigest string `json:"manifest_digest"`
	ConfigDigest   string `json:"config_digest"`
	Platform       string `json:"platform,omitempty"`
	// Layers are the diff ids of its layers, bottom to top.
	Layers  []string  `json:"layers"`
	Config  Config    `json:"config"`
	Size    int64     `json:"size_bytes"` // the layers' unpacked file bytes
	Created time.Time `json:"created"`
}

// UnpackStats says what unpacking a layer did with its entries.
type UnpackStats struct {
	Entries        int   `json:"entries"`
	Bytes          int64 `json:"bytes"` // regular files' content
	Whiteouts      int   `json:"whiteouts"`
	Opaques        int   `json:"opaques"`
	SkippedDevices int   `json:"skipped_devices"`
	StrippedSetuid int   `json:"stripped_setuid"`
}

// layerRecord is layers/sha256/<hex>/layer.json, written before the layer's directory is
// renamed into place: a layer directory with a readable record is whole.
type layerRecord struct {
	Format int    `json:"format"`
	DiffID string `json:"diff_id"`
	// Size is the length of the layer's tar stream.
	Size  int64       `json:"size"`
	Stats UnpackStats `json:"stats"`
}

// imageConfig is the part of an OCI (or docker) image configuration that the store reads.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant"`
	Config       struct {
		Env        []string `json:"Env"`
		WorkingDir string   `json:"WorkingDir"`
		User       string   `json:"User"`
		Entrypoint []string `json:"Entrypoint"`
		Cmd        []string `json:"Cmd"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

func parseConfig(data []byte) (*imageConfig, error) {
	var c imageConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, badArchive("the image configuration is not valid JSON: %v", err)
	}
	if c.RootFS.Type != "layers" {
		return nil, badArchive("the image configuration's rootfs type is %q, not \"layers\"", c.RootFS.Type)
	}
	for _, d := range c.RootFS.DiffIDs {
		if _, err := digestHex(d); err != nil {
			return nil, badArchive("the layer diff id %q is not a sha256 digest", d)
		}
	}
	if c.OS != "" && c.OS != "linux" {
		return nil, badArchive("the image is for %q; bothyd runs Linux images", c.OS)
	}
	return &c, nil
}

func (c *imageConfig) platform() string {
	p := c.OS + "/" + c.Architecture
	if c.Variant != "" {
		p += "/" + c.Variant
	}
	return strings.Trim(p, "/")
}

func (c *imageConfig) shown() Config {
	return Config{
		Env: slices.Clone(c.Config.Env), WorkingDir: c.Config.WorkingDir, User: c.Config.User,
		Entrypoint: slices.Clone(c.Config.Entrypoint), Cmd: slices.Clone(c.Config.Cmd),
	}
}

func readImage(refs *os.File, name string) (*Image, error) {
	data, err := platform.ReadFileAt(refs, name+refExt, record.MaxSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errcode.New(errcode.ImageNotFound, "There is no image %q.", name)
	}
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "The record of image %s does not read; run bothyd check.", name)
	}
	var img Image
	if err := record.Decode("image "+name, data, imageFormat, &img); err != nil {
		return nil, err
	}
	if img.Name != name {
		return nil, errcode.New(errcode.Internal, "The record of image %s names %q; run bothyd check.", name, img.Name)
	}
	return &img, nil
}

func writeImage(refs *os.File, img *Image) error {
	img.Format = imageFormat
	data, err := record.Encode(img)
	if err != nil {
		return err
	}
	return platform.WriteFileDurableAt(refs, img.Name+refExt, data, record.Perm)
}

func readLayerRecord(dir *os.File) (*layerRecord, error) {
	data, err := platform.ReadFileAt(dir, LayerRec, record.MaxSize)
	if err != nil {
		return nil, err
	}
	var rec layerRecord
	if err := record.Decode("layer "+dir.Name(), data, layerFormat, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}
