package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/image"
)

// Images. A sandbox runs on one of three kinds of image: the built-in host image, a root
// file system directory that an operator put under the state root's images/, or an OCI
// image of the image store (pulled or imported), whose layers the sandbox stacks below a
// small layer of files bothyd adds (see imagefiles_linux.go). OCI images are resources
// with references: a sandbox provisioned on one and a template generation captured on one
// each hold a durable reference in the image store, which refuses to delete (or replace)
// an image while any remains.

// The types of the image events.
const (
	EventImagePullProgress = "image.pull.progress"
	EventImagePulled       = "image.pulled"
	EventImageImported     = "image.imported"
	EventImageFailed       = "image.failed"
	EventImageDeleted      = "image.deleted"
)

// The kinds of image ([ImageInfo.Kind]).
const (
	ImageKindHost      = "host"
	ImageKindDirectory = "directory"
	ImageKindOCI       = "oci"
)

// The states of an image ([ImageInfo.State]).
const (
	ImageReady   = "ready"
	ImagePulling = "pulling"
	ImageFailed  = "failed"
)

// pullTimeout bounds one pull; a pull of many gigabytes over a slow link needs long.
const pullTimeout = 6 * time.Hour

// ImageConfig is the part of an OCI image's configuration that bothyd honours or shows.
type ImageConfig = image.Config

// ImageLayer is one layer of an image, bottom first, with a pull's progress on it.
type ImageLayer struct {
	DiffID string
	// Done and Total are bytes of the layer's blob read and in all (Total -1: unknown);
	// only a pull in progress, or one that failed, reports them.
	Done, Total int64
	// Present says the store held the layer already, so nothing of it was read.
	Present bool
}

// ImageInfo is the view of one image.
type ImageInfo struct {
	Name  string
	Kind  string // ImageKindHost, ImageKindDirectory or ImageKindOCI
	State string // ImageReady, ImagePulling or ImageFailed
	// Ref is the reference an OCI image was pulled by ("" for an import).
	Ref                  string
	Digest, ConfigDigest string
	Platform             string
	Layers               []ImageLayer
	Size                 int64 // bytes of the layers' files
	Config               ImageConfig
	Created              time.Time
	Error                string // why a pull failed
	UsedBy               []string
}

// ImageProgress is a pull's progress on one layer, for EventImagePullProgress.
type ImageProgress struct {
	Layer       int // 0 at the bottom
	DiffID      string
	Done, Total int64
}

// pull is a pull this supervisor runs, kept until it succeeds (the record then answers) or,
// when it failed, until the next pull or delete of its name.
type pull struct {
	mu     sync.Mutex
	name   string
	ref    string
	state  string
	layers map[int]ImageLayer
	err    string
	start  time.Time
	last   time.Time // of the last progress event
}

func (p *pull) info() *ImageInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := &ImageInfo{Name: p.name, Kind: ImageKindOCI, State: p.state, Ref: p.ref, Error: p.err, Created: p.start}
	for _, i := range slices.Sorted(maps.Keys(p.layers)) {
		info.Layers = append(info.Layers, p.layers[i])
	}
	return info
}

func (s *Supervisor) requireImages() error {
	if s.images == nil {
		return errcode.New(errcode.NotImplemented, "This server has no image store configured.")
	}
	return nil
}

// validateImageName checks the name of an OCI image to create: a valid name that is neither
// the host image nor a directory under images/.
func (s *Supervisor) validateImageName(name string) error {
	if err := image.ValidateName(name); err != nil {
		return err
	}
	if fi, err := os.Lstat(filepath.Join(s.store.Root(), image.ImagesDir, name)); err == nil && fi.IsDir() {
		return errcode.New(errcode.AlreadyProvisioned, "The image name %q is taken by a root file system directory under the state root's images/; choose another name.", name)
	}
	return nil
}

// ociImage returns the image store's record of name, or nil when it has none (the host
// image, a directory, or no such image).
func (s *Supervisor) ociImage(name string) (*image.Image, error) {
	if s.images == nil || name == HostImage || image.ValidateName(name) != nil {
		return nil, nil
	}
	img, err := s.images.Get(name)
	if errcode.Of(err) == errcode.ImageNotFound {
		return nil, nil
	}
	return img, err
}

// ListImages returns every image: the host image, the directories under images/, then the
// image store's images and the pulls in progress or failed, by name.
func (s *Supervisor) ListImages() ([]*ImageInfo, error) {
	names, err := s.Images()
	if err != nil {
		return nil, err
	}
	out := []*ImageInfo{}
	seen := map[string]bool{}
	for _, n := range names {
		if img, _ := s.ociImage(n); img != nil {
			continue // listed with the store's, below
		}
		kind := ImageKindDirectory
		if n == HostImage {
			kind = ImageKindHost
		}
		out = append(out, &ImageInfo{Name: n, Kind: kind, State: ImageReady})
		seen[n] = true
	}
	if s.images == nil {
		return out, nil
	}
	imgs, err := s.images.List()
	if err != nil {
		return nil, err
	}
	var oci []*ImageInfo
	for _, img := range imgs {
		if seen[img.Name] {
			continue
		}
		oci = append(oci, s.infoOf(img))
		seen[img.Name] = true
	}
	s.mu.Lock()
	for n, p := range s.pulls {
		if !seen[n] {
			oci = append(oci, p.info())
		}
	}
	s.mu.Unlock()
	slices.SortFunc(oci, func(a, b *ImageInfo) int { return strings.Compare(a.Name, b.Name) })
	return append(out, oci...), nil
}

// Image returns one image (image-not-found if there is none of that name). A pull in
// progress or failed shows as such, even over an earlier record of the same name.
func (s *Supervisor) Image(name string) (*ImageInfo, error) {
	switch name {
	case HostImage:
		return &ImageInfo{Name: name, Kind: ImageKindHost, State: ImageReady}, nil
	}
	s.mu.Lock()
	p := s.pulls[name]
	s.mu.Unlock()
	if p != nil {
		return p.info(), nil
	}
	img, err := s.ociImage(name)
	if err != nil {
		return nil, err
	}
	if img != nil {
		return s.infoOf(img), nil
	}
	if _, err := s.imageDir(name); err != nil {
		return nil, err
	}
	return &ImageInfo{Name: name, Kind: ImageKindDirectory, State: ImageReady}, nil
}

func (s *Supervisor) infoOf(img *image.Image) *ImageInfo {
	info := &ImageInfo{
		Name: img.Name, Kind: ImageKindOCI, State: ImageReady, Ref: img.Ref,
		Digest: img.ManifestDigest, ConfigDigest: img.ConfigDigest, Platform: img.Platform,
		Size: img.Size, Config: img.Config, Created: img.Created,
	}
	for _, d := range img.Layers {
		info.Layers = append(info.Layers, ImageLayer{DiffID: d})
	}
	if uses, err := s.images.Uses(img.Name); err == nil {
		for _, u := range uses {
			info.UsedBy = append(info.UsedBy, u.String())
		}
	}
	return info
}

// PullRequest is an image to pull.
type PullRequest struct {
	Ref string
	// Name is the local name; "" derives one from the reference (its last path element,
	// and its tag unless that is "latest").
	Name string
	// Platform, when set, must be the one this server pulls for (see [image.HostPlatform]):
	// a sandbox runs the host's architecture only.
	Platform string
}

// PullImage starts pulling an image and returns it in state pulling at once; the pull goes
// on after the call returns, and reports its progress as events and on [Supervisor.Image].
// A pull of a name that is being pulled from the same reference joins it; two pulls of one
// reference under two names share one download (see [image.Store.Pull]).
func (s *Supervisor) PullImage(ctx context.Context, req PullRequest) (*ImageInfo, error) {
	if err := s.requireImages(); err != nil {
		return nil, err
	}
	if req.Ref == "" || len(req.Ref) > 1024 || strings.ContainsAny(req.Ref, " \t\n\x00") {
		return nil, errcode.Invalid("ref", "Give an image reference such as registry.example.com/repo:tag or repo@sha256:<digest>.")
	}
	if req.Platform != "" && req.Platform != s.imagePlatform {
		// A well-formed platform this host cannot run is the server's limit, not a malformed
		// request (issue 38): the contract says which platforms are well-formed.
		e := errcode.New(errcode.Unavailable, "This server runs %s images only; leave out platform or give %q.", s.imagePlatform, s.imagePlatform)
		e.Field = "platform"
		return nil, e
	}
	name := req.Name
	if name == "" {
		name = NameFromRef(req.Ref)
	}
	if err := s.validateImageName(name); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errcode.New(errcode.Unavailable, "The server is shutting down.")
	}
	if p := s.pulls[name]; p != nil && p.state == ImagePulling {
		if p.ref != req.Ref {
			return nil, errcode.New(errcode.TransitionInProgress, "Image %s is being pulled from %s; wait for that pull to end, or choose another name.", name, p.ref)
		}
		return p.info(), nil
	}
	p := &pull{name: name, ref: req.Ref, state: ImagePulling, layers: map[int]ImageLayer{}, start: time.Now().UTC()}
	s.pulls[name] = p
	s.wg.Add(1)
	go s.runPull(p)
	return p.info(), nil
}

// NameFromRef is the local name a pull of ref gets when it names none: the last element of
// the repository, with "-<tag>" unless the tag is "latest" or absent, lowercased and cut to
// a valid name.
func NameFromRef(ref string) string {
	rest, _, _ := strings.Cut(ref, "@")
	repo := rest
	tag := ""
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
		repo, tag = rest[:i], rest[i+1:]
	}
	name := repo[strings.LastIndexByte(repo, '/')+1:]
	if tag != "" && tag != "latest" {
		name += "-" + tag
	}
	var b strings.Builder
	for _, c := range strings.ToLower(name) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteRune(c)
		}
	}
	name = strings.TrimLeft(b.String(), "._-")
	if len(name) > 63 {
		name = name[:63]
	}
	if name == "" || name == HostImage {
		name = "image"
	}
	return name
}

// runPull runs one pull to its end.
func (s *Supervisor) runPull(p *pull) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.life, pullTimeout)
	defer cancel()
	img, err := s.images.Pull(ctx, p.ref, p.name, func(lp image.LayerProgress) { s.pullProgress(p, lp) })
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pulls[p.name] != p {
		return // deleted meanwhile
	}
	if err != nil {
		p.mu.Lock()
		p.state, p.err = ImageFailed, publicMessage(err)
		p.mu.Unlock()
		s.log.Warn("image pull failed", "image", p.name, "ref", p.ref, "err", err)
		s.emit(Event{Type: EventImageFailed, Image: p.name, Error: publicMessage(err)})
		return
	}
	delete(s.pulls, p.name)
	s.log.Info("image pulled", "image", img.Name, "ref", p.ref, "digest", img.ManifestDigest, "layers", len(img.Layers))
	s.emit(Event{Type: EventImagePulled, Image: img.Name})
}

// pullProgress records a layer's progress and reports it, a few times a second at most per
// pull, and at the end of every layer.
func (s *Supervisor) pullProgress(p *pull, lp image.LayerProgress) {
	p.mu.Lock()
	p.layers[lp.Index] = ImageLayer{DiffID: lp.DiffID, Done: lp.Done, Total: lp.Total, Present: lp.Present}
	now := time.Now()
	report := lp.Done == lp.Total || now.Sub(p.last) >= progressInterval
	if report {
		p.last = now
	}
	p.mu.Unlock()
	if report {
		s.emit(Event{Type: EventImagePullProgress, Image: p.name,
			ImageProgress: &ImageProgress{Layer: lp.Index, DiffID: lp.DiffID, Done: lp.Done, Total: lp.Total}})
	}
}

// ImportImage imports a docker save archive or an OCI image layout tarball from r as the
// image name (see [image.Store.Import]); the caller bounds r.
func (s *Supervisor) ImportImage(ctx context.Context, name string, r io.Reader) (_ *ImageInfo, err error) {
	defer s.observe("image-import", time.Now(), &err)
	if err := s.requireImages(); err != nil {
		return nil, err
	}
	if err := s.validateImageName(name); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if p := s.pulls[name]; p != nil && p.state == ImagePulling {
		s.mu.Unlock()
		return nil, errcode.New(errcode.TransitionInProgress, "Image %s is being pulled; wait for the pull to end, or choose another name.", name)
	}
	s.mu.Unlock()
	// The store's lock waits need a deadline; the body's arrival is bounded by the server.
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	img, err := s.images.Import(ctx, name, r, nil)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.pulls, name) // a failed pull of the name is superseded
	s.mu.Unlock()
	s.emit(Event{Type: EventImageImported, Image: name})
	return s.infoOf(img), nil
}

// DeleteImage deletes an OCI image, refusing with image-in-use while a sandbox or a template
// generation uses it. References whose user is gone (a sandbox deleted, a generation retired,
// by a process that stopped before it released them) are swept first, under the image store's
// lock, which every reference is written under. The host image and directories under
// images/ are not the store's to delete.
func (s *Supervisor) DeleteImage(ctx context.Context, name string) error {
	if err := s.requireImages(); err != nil {
		return err
	}
	if name == HostImage {
		return errcode.New(errcode.InvalidRequest, "The host image is built in; it cannot be deleted.")
	}
	s.mu.Lock()
	if p := s.pulls[name]; p != nil {
		if p.state == ImagePulling {
			s.mu.Unlock()
			return errcode.New(errcode.TransitionInProgress, "Image %s is being pulled; wait for the pull to end, then delete it.", name)
		}
		delete(s.pulls, name)
		if img, _ := s.ociImage(name); img == nil {
			s.mu.Unlock()
			s.emit(Event{Type: EventImageDeleted, Image: name})
			return nil // only the failed pull was there
		}
	}
	s.mu.Unlock()
	if img, err := s.ociImage(name); err != nil {
		return err
	} else if img == nil {
		if _, err := s.imageDir(name); err == nil {
			// The operator put it there, not the image store: the API does not remove it.
			return errcode.New(errcode.ForeignFiles, "Image %s is a root file system directory under the state root's images/, which bothyd did not make; remove the directory by hand.", name)
		}
		return errcode.New(errcode.ImageNotFound, "There is no image %q.", name)
	}
	tx, err := s.images.Lock(ctx)
	if err != nil {
		return err
	}
	defer tx.Unlock()
	uses, err := tx.Uses(name)
	if err != nil {
		return err
	}
	for _, u := range uses {
		if s.staleUse(u) {
			if err := tx.RemoveUse(name, u.Kind, u.ID); err != nil {
				return err
			}
			s.log.Info("swept a stale image reference", "image", name, "user", u.String())
		}
	}
	if err := tx.Delete(name); err != nil {
		return err
	}
	s.emit(Event{Type: EventImageDeleted, Image: name})
	return nil
}

// staleUse says a reference's user is gone. It is called under the image store's lock, which
// a provision holds from writing its reference until its configuration is written: a
// sandbox reference without a configuration is one whose sandbox is gone, not one being made.
func (s *Supervisor) staleUse(u image.Use) bool {
	switch u.Kind {
	case image.UseSandbox:
		_, err := s.store.ReadConfigUnlocked(u.ID)
		return errcode.Of(err) == errcode.SandboxNotFound
	case image.UseGeneration:
		if s.templates == nil {
			return false
		}
		tmpl, gen, ok := strings.Cut(u.ID, "/")
		if !ok {
			return false
		}
		return s.generationGone(tmpl, gen)
	}
	return false
}

// generationGone says a generation no longer exists or is retired.
func (s *Supervisor) generationGone(tmpl, gen string) bool {
	now, err := s.templates.Now()
	if err != nil {
		return false
	}
	_, err = s.templates.Generation(tmpl, gen, now)
	switch errcode.Of(err) { // a retired generation is gone
	case errcode.GenerationNotFound, errcode.TemplateNotFound:
		return true
	}
	return false
}

// imageUse is a reference a provision holds on its image while it provisions, with the image
// store's lock.
type imageUse struct {
	s       *Supervisor
	tx      *image.Tx
	name    string
	id      string
	created bool
}

// referImage checks that a sandbox can be provisioned on the image name and, for an OCI
// image, takes the image store's lock and writes the sandbox's reference durably, before the
// sandbox exists. The caller calls done with its result: a failed provision removes a
// reference it created, and the lock is released.
func (s *Supervisor) referImage(ctx context.Context, name, id string) (*imageUse, error) {
	img, err := s.ociImage(name)
	if err != nil {
		return nil, err
	}
	if img == nil {
		if _, err := s.imageDir(name); err != nil {
			return nil, err
		}
		return &imageUse{}, nil
	}
	tx, err := s.images.Lock(ctx)
	if err != nil {
		return nil, err
	}
	created, err := tx.AddUse(name, image.UseSandbox, id)
	if err != nil {
		_ = tx.Unlock()
		return nil, err
	}
	return &imageUse{s: s, tx: tx, name: name, id: id, created: created}, nil
}

func (u *imageUse) done(errp *error) {
	if u.tx == nil {
		return
	}
	if *errp != nil && u.created {
		if err := u.tx.RemoveUse(u.name, image.UseSandbox, u.id); err != nil {
			u.s.log.Warn("removing the image reference of a failed provision; bothyd check repairs it", "sandbox", u.id, "image", u.name, "err", err)
		}
	}
	_ = u.tx.Unlock()
}

// releaseImage removes a user's reference to an image once the user is gone. A failure
// leaves a stale reference, which the image's delete sweeps and bothyd check repairs; it is
// logged, not returned.
func (s *Supervisor) releaseImage(ctx context.Context, name string, kind image.UseKind, id string) {
	if s.images == nil || name == "" || name == HostImage || image.ValidateName(name) != nil {
		return
	}
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	tx, err := s.images.Lock(cctx)
	if err == nil {
		err = tx.RemoveUse(name, kind, id)
		_ = tx.Unlock()
	}
	if err != nil {
		s.log.Warn("releasing an image reference; bothyd check repairs it", "image", name, "user", string(kind)+" "+id, "err", err)
	}
}

// referGeneration writes the reference of a generation captured on an OCI image.
func (s *Supervisor) referGeneration(ctx context.Context, name, tmpl, gen string) error {
	if img, err := s.ociImage(name); err != nil || img == nil {
		return err
	}
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	tx, err := s.images.Lock(cctx)
	if err != nil {
		return err
	}
	defer tx.Unlock()
	_, err = tx.AddUse(name, image.UseGeneration, tmpl+"/"+gen)
	return err
}

// releaseGenerations releases the image references of the generations of tmpl that are gone
// (gen "" for all of the template's).
func (s *Supervisor) releaseGenerations(ctx context.Context, tmpl, gen string) {
	if s.images == nil || s.templates == nil {
		return
	}
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	tx, err := s.images.Lock(cctx)
	if err != nil {
		s.log.Warn("releasing the image references of retired generations", "template", tmpl, "err", err)
		return
	}
	defer tx.Unlock()
	uses, err := tx.AllUses()
	if err != nil {
		return
	}
	for _, u := range uses {
		t, g, _ := strings.Cut(u.ID, "/")
		if u.Kind != image.UseGeneration || t != tmpl || (gen != "" && g != gen) || !s.generationGone(t, g) {
			continue
		}
		if err := tx.RemoveUse(u.Image, u.Kind, u.ID); err != nil {
			s.log.Warn("releasing an image reference", "image", u.Image, "user", u.String(), "err", err)
		}
	}
}

// imageDigest is the manifest digest of an OCI image, "" for the others.
func (s *Supervisor) imageDigest(name string) (string, error) {
	img, err := s.ociImage(name)
	if err != nil || img == nil {
		return "", err
	}
	return img.ManifestDigest, nil
}

// imageStack is what a launch stacks for its image.
type imageStack struct {
	dir    string   // Spec.ImageDir
	lowers []string // to go below the clone's layers, top first
	config ImageConfig
}

// stackImage resolves a sandbox's image into the runtime's terms. An OCI image is its layers,
// the bottom one as the image directory and the others as lowers, under a layer of files
// bothyd adds, made afresh in the sandbox's state directory for this launch.
func (s *Supervisor) stackImage(dir string, cfg *store.Config) (*imageStack, error) {
	img, err := s.ociImage(cfg.Image)
	if err != nil {
		return nil, err
	}
	if img == nil {
		d, err := s.imageDir(cfg.Image)
		if err != nil {
			return nil, err
		}
		return &imageStack{dir: d}, nil
	}
	layers, err := s.images.LayerDirs(img.Name) // top first
	if err != nil {
		return nil, err
	}
	if len(layers) == 0 {
		return nil, errcode.New(errcode.InvalidRequest, "Image %s has no layers, so there is nothing to run; import or pull an image with files.", img.Name)
	}
	hostname := cfg.ID
	files := filepath.Join(dir, ImageFilesName)
	if err := writeImageFiles(files, layers, img.Config, hostname); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "The files bothyd adds to image %s could not be made for sandbox %s.", img.Name, cfg.ID)
	}
	return &imageStack{
		dir:    layers[len(layers)-1],
		lowers: append([]string{files}, layers[:len(layers)-1]...),
		config: img.Config,
	}, nil
}

// env is the sandbox's default environment: the image's Env under the sandbox's own.
func (st *imageStack) env(own map[string]string) map[string]string {
	if len(st.config.Env) == 0 {
		return own
	}
	out := map[string]string{}
	for _, e := range st.config.Env {
		if k, v, ok := strings.Cut(e, "="); ok && k != "" {
			out[k] = v
		}
	}
	maps.Copy(out, own)
	return out
}

// execDefaults are what an image's configuration makes the defaults of every exec.
type execDefaults struct {
	cwd  string
	user string
}

// execDefaultsOf reads the image's WorkingDir and User. The agent runs workloads as root or
// as the sandbox's user (uid 1000): an image User of root (or uid 0) makes root the default;
// any other User is the sandbox's user, the only unprivileged one the agent knows.
func (s *Supervisor) execDefaultsOf(name string) execDefaults {
	img, err := s.ociImage(name)
	if err != nil || img == nil {
		return execDefaults{}
	}
	d := execDefaults{cwd: img.Config.WorkingDir}
	if isRootUser(img.Config.User) {
		d.user = "root"
	}
	return d
}

func isRootUser(u string) bool {
	user, _, _ := strings.Cut(u, ":")
	return user == "root" || user == "0"
}

// apply fills in what the request leaves out.
func (d execDefaults) apply(req ExecRequest) ExecRequest {
	if req.Cwd == "" && strings.HasPrefix(d.cwd, "/") {
		req.Cwd = d.cwd
	}
	if req.User == "" {
		req.User = d.user
	}
	return req
}

// CheckImageUses is for bothyd check: it reports references whose user is gone, under the
// image store's lock, and with repair removes them. It answers nothing without an image store.
func (s *Supervisor) CheckImageUses(ctx context.Context, repair bool) ([]image.Use, error) {
	if s.images == nil {
		return nil, nil
	}
	tx, err := s.images.Lock(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Unlock()
	uses, err := tx.AllUses()
	if err != nil {
		return nil, err
	}
	var stale []image.Use
	var errs []error
	for _, u := range uses {
		if !s.staleUse(u) {
			continue
		}
		stale = append(stale, u)
		if repair {
			errs = append(errs, tx.RemoveUse(u.Image, u.Kind, u.ID))
		}
	}
	return stale, errors.Join(errs...)
}

// publicMessage is what a client may read of a failed pull: a coded error's message, or the
// cause (the registry's answer, which names nothing of this host).
func publicMessage(err error) string {
	var e *errcode.Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return fmt.Sprintf("The pull failed: %v.", err)
}
