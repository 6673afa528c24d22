package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"

	"github.com/bothy/bothy/platform"
)

// maxJSONMember bounds a manifest, an index or a configuration read from an archive.
const maxJSONMember = 4 << 20

// Media types of indexes (an OCI image index or a docker manifest list).
const (
	mediaOCIIndex    = "application/vnd.oci.image.index.v1+json"
	mediaDockerIndex = "application/vnd.docker.distribution.manifest.list.v2+json"
)

// member is one regular file of an imported archive, spooled to staging.
type member struct {
	file   string // its name in the staging directory
	size   int64
	digest string
}

// archive is an imported archive's members by cleaned name; links are kept as names to
// resolve, never created on disk.
type archive struct {
	dir     *os.File
	members map[string]member
	links   map[string]string
}

// Import reads an image archive from r, a `docker save` archive or an OCI image layout
// tarball (plain, gzip or zstd), and records it as the image name. The archive is read once,
// as a stream: its members are spooled under the store's staging directory (bounded by
// Options.MaxArchiveBytes and a member count) while their digests are computed, because
// either format may put its manifest after its layers; then every blob is checked against
// the digest that names it, and each layer the store does not hold is unpacked and checked
// against its diff id. The spool is removed when Import returns; one left by a crash is
// removed by Repair.
func (s *Store) Import(ctx context.Context, name string, r io.Reader, progress Progress) (*Image, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	key := importKey()
	w, err := s.lockWork(ctx, key, true)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.release() }()
	if err := platform.MkdirAt(s.stage, key, 0o700); err != nil {
		return nil, err
	}
	dir, err := platform.OpenDirAt(s.stage, key)
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = os.RemoveAll(dir.Name())
		dir.Close()
	}()
	a := &archive{dir: dir, members: make(map[string]member), links: make(map[string]string)}
	if err := s.spool(ctx, a, r); err != nil {
		return nil, err
	}
	var src *Source
	if _, ok := a.members["oci-layout"]; ok {
		src, err = a.ociSource(s.wantPlatform())
	} else if _, ok := a.members["manifest.json"]; ok {
		src, err = a.dockerSource()
	} else {
		err = badArchive("it has neither oci-layout (an OCI image layout) nor manifest.json (a docker save archive)")
	}
	if err != nil {
		return nil, err
	}
	return s.add(ctx, name, src, progress)
}

// spool reads the archive's members into a.dir.
func (s *Store) spool(ctx context.Context, a *archive, r io.Reader) error {
	outer := &meter{ctx: ctx, r: r, h: sha256.New(), max: s.opts.MaxArchiveBytes, what: "archive"}
	plain, closeDec, err := decompress(outer)
	if err != nil {
		return err
	}
	defer closeDec()
	tr := tar.NewReader(&meter{ctx: ctx, r: plain, h: nopHash{}, max: s.opts.MaxArchiveBytes, what: "decompressed archive"})
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			// A bound or a cancellation is reported as itself, not as a bad archive.
			if errors.Is(err, ErrTooLarge) || ctx.Err() != nil {
				return err
			}
			return badArchive("it is not a valid tar archive: %v", err)
		}
		if n >= maxArchiveMembers {
			return tooLarge("the archive has more than %d members", maxArchiveMembers)
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return badArchive("the member %q: %v", hdr.Name, err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir, tar.TypeXGlobalHeader:
		case tar.TypeReg, '\x00':
			if err := a.spoolFile(name, strconv.Itoa(n), tr); err != nil {
				return err
			}
		case tar.TypeSymlink:
			// docker save links a layer that two images share to its first copy.
			// A name in the archive's own namespace, looked up among its spooled members and
			// never created or opened on disk: no traversal is possible (gosec G305).
			a.links[name] = path.Join(path.Dir(name), hdr.Linkname) //nolint:gosec // see above
		case tar.TypeLink:
			a.links[name] = path.Clean(hdr.Linkname)
		default:
			return badArchive("the member %q has tar type %q, which no image archive holds", hdr.Name, hdr.Typeflag)
		}
	}
}

type nopHash struct{}

func (nopHash) Write(p []byte) (int, error) { return len(p), nil }
func (nopHash) Sum(b []byte) []byte         { return b }
func (nopHash) Reset()                      {}
func (nopHash) Size() int                   { return 0 }
func (nopHash) BlockSize() int              { return 1 }

func (a *archive) spoolFile(name, file string, r io.Reader) error {
	f, err := platform.OpenFileAt(a.dir, file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if err != nil {
		return err
	}
	m := member{file: file, size: n, digest: digestOf(h.Sum(nil))}
	// A blob's name is its digest: a blob that does not hash to its name is refused here,
	// whatever refers to it.
	if hexID, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
		if want := Algorithm + ":" + hexID; want != m.digest {
			return digestMismatch("blob "+name, want, m.digest)
		}
	}
	a.members[name] = m
	return nil
}

// lookup finds a member by name, through at most a few links, none leading out.
func (a *archive) lookup(name string) (member, error) {
	for range 8 {
		if strings.HasPrefix(name, "../") || name == ".." || strings.HasPrefix(name, "/") {
			return member{}, badArchive("the member %q is outside the archive", name)
		}
		if m, ok := a.members[name]; ok {
			return m, nil
		}
		target, ok := a.links[name]
		if !ok {
			return member{}, badArchive("it has no member %q", name)
		}
		name = target
	}
	return member{}, badArchive("the member %q is behind too many links", name)
}

func (a *archive) readJSON(name string, v any) ([]byte, error) {
	m, err := a.lookup(name)
	if err != nil {
		return nil, err
	}
	return a.readMember(m, name, v)
}

// readMember reads the JSON member m (name is for errors) into v, unless v is nil.
func (a *archive) readMember(m member, name string, v any) ([]byte, error) {
	data, err := platform.ReadFileAt(a.dir, m.file, maxJSONMember)
	if err != nil {
		return nil, badArchive("the member %q does not read: %v", name, err)
	}
	if v != nil {
		if err := json.Unmarshal(data, v); err != nil {
			return nil, badArchive("the member %q is not valid JSON: %v", name, err)
		}
	}
	return data, nil
}

func (a *archive) opener(m member) func(context.Context) (io.ReadCloser, error) {
	return func(context.Context) (io.ReadCloser, error) {
		return platform.OpenFileAt(a.dir, m.file, os.O_RDONLY, 0)
	}
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Variant      string `json:"variant"`
	} `json:"platform"`
}

// blob returns the member that d names, checked against d's digest and size.
func (a *archive) blob(d descriptor) (member, error) {
	hexID, err := digestHex(d.Digest)
	if err != nil {
		return member{}, badArchive("the descriptor digest %q is not a sha256 digest", d.Digest)
	}
	m, err := a.lookup("blobs/sha256/" + hexID)
	if err != nil {
		return member{}, err
	}
	if m.digest != d.Digest {
		return member{}, digestMismatch("blob "+d.Digest, d.Digest, m.digest)
	}
	if d.Size != m.size {
		return member{}, badArchive("the blob %s has %d bytes, its descriptor says %d", d.Digest, m.size, d.Size)
	}
	return m, nil
}

// ociSource reads an OCI image layout: index.json, through nested indexes, to the one image
// manifest for the platform want.
func (a *archive) ociSource(want string) (*Source, error) {
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if _, err := a.readJSON("index.json", &index); err != nil {
		return nil, err
	}
	d, err := a.resolve(index.Manifests, want, 0)
	if err != nil {
		return nil, err
	}
	m, err := a.blob(d)
	if err != nil {
		return nil, err
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if _, err := a.readMember(m, d.Digest, &manifest); err != nil {
		return nil, err
	}
	cm, err := a.blob(manifest.Config)
	if err != nil {
		return nil, err
	}
	config, err := a.readMember(cm, manifest.Config.Digest, nil)
	if err != nil {
		return nil, err
	}
	src := &Source{ManifestDigest: d.Digest, Config: config, ConfigDigest: manifest.Config.Digest}
	for _, ld := range manifest.Layers {
		lm, err := a.blob(ld)
		if err != nil {
			return nil, err
		}
		src.Layers = append(src.Layers, SourceLayer{Digest: ld.Digest, Size: ld.Size, Open: a.opener(lm)})
	}
	return src, nil
}

// resolve picks the one image manifest among ds for the platform want, descending into
// indexes (at most four deep).
func (a *archive) resolve(ds []descriptor, want string, depth int) (descriptor, error) {
	if depth > 4 {
		return descriptor{}, badArchive("its indexes nest more than four deep")
	}
	var found []descriptor
	for _, d := range ds {
		if d.Platform != nil && !platformMatches(want, d.Platform.OS, d.Platform.Architecture, d.Platform.Variant) {
			continue
		}
		if d.MediaType == mediaOCIIndex || d.MediaType == mediaDockerIndex {
			m, err := a.blob(d)
			if err != nil {
				return descriptor{}, err
			}
			var index struct {
				Manifests []descriptor `json:"manifests"`
			}
			if _, err := a.readMember(m, d.Digest, &index); err != nil {
				return descriptor{}, err
			}
			d, err := a.resolve(index.Manifests, want, depth+1)
			if err != nil {
				return descriptor{}, err
			}
			found = append(found, d)
			continue
		}
		found = append(found, d)
	}
	switch len(found) {
	case 0:
		return descriptor{}, badArchive("it holds no image for %s", want)
	case 1:
		return found[0], nil
	}
	return descriptor{}, badArchive("it holds %d images for %s; import one at a time", len(found), want)
}

// dockerSource reads a docker save archive: manifest.json names one image's configuration
// and layer tars. It has no manifest digest of its own; the image's is the digest of
// manifest.json.
func (a *archive) dockerSource() (*Source, error) {
	var manifest []struct {
		Config string   `json:"Config"`
		Layers []string `json:"Layers"`
	}
	raw, err := a.readJSON("manifest.json", &manifest)
	if err != nil {
		return nil, err
	}
	if len(manifest) != 1 {
		return nil, badArchive("it holds %d images; save and import one at a time", len(manifest))
	}
	mf := manifest[0]
	config, err := a.readJSON(path.Clean(mf.Config), nil)
	if err != nil {
		return nil, err
	}
	src := &Source{ManifestDigest: digestOf(sha256Sum(raw)), Config: config}
	// Docker names the configuration by its digest: <hex>.json, or blobs/sha256/<hex>.
	base := strings.TrimSuffix(path.Base(mf.Config), ".json")
	if isHex64(base) {
		src.ConfigDigest = Algorithm + ":" + base
	}
	for _, l := range mf.Layers {
		m, err := a.lookup(path.Clean(l))
		if err != nil {
			return nil, err
		}
		sl := SourceLayer{Size: m.size, Open: a.opener(m)}
		if hexID, ok := strings.CutPrefix(path.Clean(l), "blobs/sha256/"); ok {
			sl.Digest = Algorithm + ":" + hexID
		}
		src.Layers = append(src.Layers, sl)
	}
	return src, nil
}

func (s *Store) wantPlatform() string {
	if s.opts.Platform != "" {
		return s.opts.Platform
	}
	return HostPlatform()
}

// HostPlatform is this host's platform, "linux/<arch>".
func HostPlatform() string { return runtime.GOOS + "/" + runtime.GOARCH }

// platformMatches reports whether os/arch/variant is the platform want ("os/arch" or
// "os/arch/variant"; a want without a variant takes any).
func platformMatches(want, os, arch, variant string) bool {
	parts := strings.SplitN(want, "/", 3)
	if len(parts) < 2 || parts[0] != os || parts[1] != arch {
		return false
	}
	return len(parts) == 2 || parts[2] == variant
}

// String makes a member readable in errors.
func (m member) String() string { return fmt.Sprintf("%s (%d bytes, %s)", m.file, m.size, m.digest) }
