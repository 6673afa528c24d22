// Package registry moves template generations between nodes through an OCI registry: a
// generation is pushed as an OCI image manifest (an artifact of type [ArtifactType]) whose
// one layer is its payload as a tar stream and whose configuration is its index entry, with
// its compatibility key and time contract in the manifest's annotations too; and pulled by
// reference into a node's template store (store/template's [template.Store.Import]), where
// it is a generation like a captured one: leased, tombstoned and retired there.
//
// A registry is not trusted. What a pull reads is bounded before it is read (the manifest's
// size, the configuration's, the payload's declared size, the archive's entries), every blob
// is checked against the digest that names it, and the archive is unpacked below the
// staging directory by handle, refusing names that are not clean relative paths, links on
// the way, devices other than whiteouts and extended attributes no generation carries.
//
// Tombstones and retirements are recorded in the registry too (tombstone.go), and each
// node marks the generations it holds (held.go), so that the registry's copy of a
// tombstoned generation is deleted once no node holds one; the tombstone stays.
//
// It links net/http (through go-containerregistry), so it lives apart from store/template,
// which it knows only through the store's exported methods; it writes nothing on disk but
// through them.
package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	imagereg "github.com/bothy/bothy/store/image/registry"
	"github.com/bothy/bothy/store/template"
)

// The media types of a generation's manifest and blobs.
const (
	ArtifactType    = "application/vnd.bothy.template.generation.v1"
	ConfigMediaType = "application/vnd.bothy.template.generation.config.v1+json"
	LayerMediaType  = string(types.OCIUncompressedLayer)
)

// The annotations of a generation's manifest. Key and time hold the JSON of the generation's
// compatibility key and time contract, as its index entry does.
const (
	AnnotationTemplate   = "dev.bothy.template"
	AnnotationGeneration = "dev.bothy.generation"
	AnnotationKey        = "dev.bothy.key"
	AnnotationTime       = "dev.bothy.time"
	AnnotationCapturedAt = "dev.bothy.captured-at"
	AnnotationSize       = "dev.bothy.size"
)

// The bounds a pull holds a registry to.
const (
	// MaxManifestBytes bounds a manifest, as an image pull does (store/image/registry).
	MaxManifestBytes = 4 << 20
	// MaxConfigBytes bounds a generation's configuration: an index entry, well under 4 KiB.
	MaxConfigBytes = 64 << 10
	// DefaultMaxBytes bounds a generation's payload (the archive's declared size, and its
	// files added up) unless Options.Limits says otherwise.
	DefaultMaxBytes = 64 << 30
	// DefaultMaxEntries bounds the archive's entries.
	DefaultMaxEntries = 1 << 20
)

// configFormat is the format number of a generation's configuration blob.
const configFormat = 1

// Limits bound what a pull unpacks.
type Limits struct {
	MaxBytes   int64 // the archive's declared size, and its regular files added up
	MaxEntries int
}

// Options configure a [Registry].
type Options struct {
	// Repository is where generations go, "host[:port]/path"; a generation is the tag
	// "<template>.<generation>" in it.
	Repository string
	// AuthFile is a docker-style config.json with the registry's credentials; empty for
	// anonymous access. Credentials never come on the command line.
	AuthFile string
	// Insecure speaks plain HTTP to the registry (a loopback registry always is).
	Insecure bool
	// Limits bound pulls; zero fields take the defaults.
	Limits Limits
	// Transport, when set, carries the requests.
	Transport http.RoundTripper
	// Holder names this node's template store among the registry's users, unique and
	// stable across restarts: its marks on the generations it holds (HeldTag) keep the
	// registry's copy of a tombstoned generation until it lets go. Empty: the host's name
	// and the store's path.
	Holder string
}

// Registry pushes generations of one template store to a repository and pulls them into it.
type Registry struct {
	repo name.Repository
	opts []remote.Option
	// transport is Options.Transport, which a listing of tags wraps (nil: the library's).
	transport http.RoundTripper
	store     *template.Store
	limits    Limits

	// holder and holderID name this store in its marks (HeldTag).
	holder, holderID string

	mu      sync.Mutex
	flights map[string]*flight
	// holdMu orders the puts of this holder's marks with their removals (dropHold).
	holdMu sync.Mutex
}

// flight is one pull in progress, which every clone that needs the generation waits for.
type flight struct {
	done chan struct{}
	err  error
}

// New makes a Registry for the store ts, reading the credentials now so that a bad file is
// reported at start.
func New(opts Options, ts *template.Store) (*Registry, error) {
	var nopts []name.Option
	if opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	repo, err := name.NewRepository(opts.Repository, nopts...)
	if err != nil {
		return nil, errcode.Invalid("template_registry", "The template registry %q is not a repository (host[:port]/path): %v.", opts.Repository, err)
	}
	kc := authn.Keychain(authn.NewMultiKeychain())
	if opts.AuthFile != "" {
		if kc, err = imagereg.Keychain(opts.AuthFile); err != nil {
			return nil, err
		}
	}
	ropts := []remote.Option{remote.WithAuthFromKeychain(kc), remote.WithRetryBackoff(remote.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: 2})}
	if opts.Transport != nil {
		ropts = append(ropts, remote.WithTransport(opts.Transport))
	}
	l := opts.Limits
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	holder := opts.Holder
	if holder == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, errcode.Invalid("template_registry", "This host has no name to tell its template store from other nodes' in the template registry (%v); give one.", err)
		}
		holder = host
		if ts != nil {
			holder += ":" + ts.Path()
		}
	}
	return &Registry{repo: repo, opts: ropts, transport: opts.Transport, store: ts, limits: l, flights: map[string]*flight{},
		holder: holder, holderID: HolderID(holder)}, nil
}

// Tag is the tag of a generation in the repository.
func Tag(tmpl, gen string) string { return tmpl + "." + gen }

// Reference is the reference a generation is pushed to.
func (r *Registry) Reference(tmpl, gen string) string { return r.repo.Tag(Tag(tmpl, gen)).String() }

// genConfig is a generation's configuration blob: its index entry, as the origin recorded it.
type genConfig struct {
	Format     int                   `json:"format"`
	Template   string                `json:"template"`
	Generation string                `json:"generation"`
	Key        template.Key          `json:"key"`
	Time       template.TimeContract `json:"time"`
	CapturedAt time.Time             `json:"captured_at"`
	SizeBytes  int64                 `json:"size_bytes"`
	PauseMS    int64                 `json:"capture_pause_ms,omitempty"`
	Source     *template.Source      `json:"source,omitempty"`
}

// manifest is the part of an OCI image manifest a generation uses.
type manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     types.MediaType   `json:"mediaType"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Config        v1.Descriptor     `json:"config"`
	Layers        []v1.Descriptor   `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// rawManifest is a manifest ready to put.
type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// Push uploads generation gen of template tmpl and tags it: its configuration and payload
// blobs first (each skipped when the registry holds its digest already), then the manifest.
// It returns the manifest's digest. A tag that names another manifest already (another
// node's generation of the same id) is refused with template-exists and left as it is.
func (r *Registry) Push(ctx context.Context, tmpl, gen string) (string, error) {
	now, err := r.store.Now()
	if err != nil {
		return "", err
	}
	g, err := r.store.Generation(tmpl, gen, now)
	if err != nil {
		return "", err
	}
	if g.State != template.StateActive {
		return "", errcode.New(errcode.TemplateTombstoned, "Generation %s of template %s is %s and is not pushed.", gen, tmpl, g.State)
	}
	dir, err := r.store.PayloadDir(tmpl, gen)
	if err != nil {
		return "", err
	}
	cfg, err := json.Marshal(genConfig{Format: configFormat, Template: tmpl, Generation: gen, Key: g.Key, Time: g.Time, CapturedAt: g.CapturedAt, SizeBytes: g.SizeBytes, PauseMS: g.CapturePauseMS, Source: g.Source})
	if err != nil {
		return "", err
	}
	payload := &payloadLayer{dir: dir, blobs: newBlobIndex()}
	if err := payload.measure(); err != nil {
		return "", err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", err
	}
	defer root.Close()
	layers := []v1.Descriptor{{MediaType: types.MediaType(LayerMediaType), Size: payload.size, Digest: payload.digest}}
	for _, b := range payload.blobs.order {
		layers = append(layers, v1.Descriptor{MediaType: FileMediaType, Size: b.size, Digest: b.digest})
	}
	keyJSON, _ := json.Marshal(g.Key)
	timeJSON, _ := json.Marshal(g.Time)
	m := manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: ArtifactType,
		Config: v1.Descriptor{MediaType: ConfigMediaType, Size: int64(len(cfg)), Digest: digestOf(cfg)},
		Layers: layers,
		Annotations: map[string]string{
			AnnotationTemplate: tmpl, AnnotationGeneration: gen, AnnotationKey: string(keyJSON), AnnotationTime: string(timeJSON),
			AnnotationCapturedAt: g.CapturedAt.UTC().Format(time.RFC3339Nano), AnnotationSize: strconv.FormatInt(g.SizeBytes, 10),
		},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	want := digestOf(raw)
	ref := r.repo.Tag(Tag(tmpl, gen))
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.opts...)
	if d, err := remote.Head(ref, opts...); err == nil {
		if d.Digest == want {
			return want.String(), nil // pushed before
		}
		return "", errcode.New(errcode.TemplateExists, "The template registry holds another generation %s of template %s (%s); generation ids are per node, so capture this template on one node of the cluster.", gen, tmpl, d.Digest)
	} else if !notFound(err) {
		return "", unavailable(err)
	}
	if err := remote.WriteLayer(r.repo, &blobLayer{data: cfg, mt: ConfigMediaType}, opts...); err != nil {
		return "", unavailable(err)
	}
	for _, b := range payload.blobs.order {
		if err := remote.WriteLayer(r.repo, &fileLayer{root: root, b: b}, opts...); err != nil {
			return "", unavailable(err)
		}
	}
	if err := remote.WriteLayer(r.repo, payload, opts...); err != nil {
		return "", unavailable(err)
	}
	// This node's mark goes first: a tombstone recorded meanwhile finds it, and the copy
	// stays in the registry until this node's copy is gone.
	if err := r.hold(ctx, tmpl, gen); err != nil {
		return "", err
	}
	if err := remote.Put(ref, rawManifest(raw), opts...); err != nil {
		return "", unavailable(err)
	}
	return want.String(), nil
}

func notFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}

// unavailable is the error of a registry that could not be reached or refused a request.
func unavailable(err error) error {
	if errcode.Of(err) != "" && errcode.Of(err) != errcode.Internal {
		return err
	}
	return errcode.Wrap(errcode.RegistryUnavailable, err, "The template registry cannot be reached or refused the request (%v); try again when it is back.", err)
}

// hostile is the error of a registry that served something no push of bothy makes.
func hostile(format string, args ...any) error {
	return errcode.New(errcode.RegistryRefused, "The template registry served a generation that is refused: "+format+".", args...)
}

func digestOf(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// Pull brings generation gen of template tmpl into the store from the registry and returns
// it. Concurrent pulls of one generation in this process share one download: the second
// waits for the first and then finds the generation in the store. A generation the store
// holds already is not pulled (template-exists, which callers treat as done).
func (r *Registry) Pull(ctx context.Context, tmpl, gen string) error {
	if err := template.ValidateName(tmpl); err != nil {
		return err
	}
	if err := template.ValidateGeneration(gen); err != nil {
		return err
	}
	key := Tag(tmpl, gen)
	r.mu.Lock()
	f, joined := r.flights[key]
	if !joined {
		f = &flight{done: make(chan struct{})}
		r.flights[key] = f
		// The pull runs for every clone waiting, so one leaving does not cut it short.
		go func() {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pullTimeout)
			defer cancel()
			f.err = r.pull(pctx, tmpl, gen)
			r.mu.Lock()
			delete(r.flights, key)
			r.mu.Unlock()
			close(f.done)
		}()
	}
	r.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pullTimeout bounds one pull, however many clones wait for it.
const pullTimeout = 30 * time.Minute

// pull marks the generation as held here before anything else (see collect), and removes
// the mark again when the pull fails and the store does not hold the generation.
func (r *Registry) pull(ctx context.Context, tmpl, gen string) error {
	if err := r.hold(ctx, tmpl, gen); err != nil {
		return err
	}
	err := r.pullMarked(ctx, tmpl, gen)
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		// Best effort: a mark left behind is removed by the next Collect.
		_, _ = r.dropHold(dctx, tmpl, gen, true)
		cancel()
	}
	return err
}

func (r *Registry) pullMarked(ctx context.Context, tmpl, gen string) error {
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.opts...)
	if found, _, err := r.Tombstoned(ctx, tmpl, gen); err != nil {
		return err
	} else if found {
		return tombstonedError(tmpl, gen)
	}
	ref := r.repo.Tag(Tag(tmpl, gen))
	head, err := remote.Head(ref, opts...)
	if err != nil {
		if notFound(err) {
			return errcode.New(errcode.GenerationNotFound, "Generation %s of template %s is neither on this node nor in the template registry.", gen, tmpl)
		}
		return unavailable(err)
	}
	if head.Size <= 0 || head.Size > MaxManifestBytes {
		return hostile("the manifest of %s declares %d bytes (at most %d)", Tag(tmpl, gen), head.Size, MaxManifestBytes)
	}
	// By digest, so that the library checks what it reads against it.
	desc, err := remote.Get(r.repo.Digest(head.Digest.String()), opts...)
	if err != nil {
		return unavailable(err)
	}
	if int64(len(desc.Manifest)) > MaxManifestBytes || digestOf(desc.Manifest) != head.Digest {
		return hostile("the manifest of %s is not the one its digest names", Tag(tmpl, gen))
	}
	var m manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		return hostile("the manifest of %s is not JSON: %v", Tag(tmpl, gen), err)
	}
	if err := r.checkManifest(&m, tmpl, gen); err != nil {
		return err
	}
	layer := m.Layers[0]
	cfgData, err := r.readBlob(ctx, m.Config, opts)
	if err != nil {
		return err
	}
	var cfg genConfig
	if err := json.Unmarshal(cfgData, &cfg); err != nil || cfg.Format != configFormat || cfg.Template != tmpl || cfg.Generation != gen {
		return hostile("the configuration of %s is not the index entry of %s/%s", Tag(tmpl, gen), tmpl, gen)
	}
	if cfg.Source != nil && cfg.Source.Validate() != nil {
		return hostile("the configuration of %s names a source this service cannot have made", Tag(tmpl, gen))
	}
	in := template.Imported{Key: cfg.Key, Time: cfg.Time, CapturedAt: cfg.CapturedAt, PauseMS: cfg.PauseMS, Source: cfg.Source}
	_, err = r.store.Import(ctx, tmpl, gen, in, func(ctx context.Context, payload *os.File) (int64, error) {
		body, err := r.openBlob(ctx, layer, opts)
		if err != nil {
			return 0, err
		}
		defer body.Close()
		files := map[v1.Hash]v1.Descriptor{}
		for _, d := range m.Layers[1:] {
			files[d.Digest] = d
		}
		size, err := extractArchive(body, payload, r.limits, files, func(d v1.Descriptor) (blobReader, error) { return r.openBlob(ctx, d, opts) })
		if err != nil {
			return 0, err
		}
		// The archive is read to its end, so that the digest covers every byte.
		if _, err := io.Copy(io.Discard, body); err != nil {
			return 0, err
		}
		return size, body.verify()
	})
	return err
}

// checkManifest holds a manifest to what a push makes and to the pull's bounds.
func (r *Registry) checkManifest(m *manifest, tmpl, gen string) error {
	if m.MediaType != types.OCIManifestSchema1 || m.ArtifactType != ArtifactType || m.Config.MediaType != ConfigMediaType ||
		len(m.Layers) == 0 || string(m.Layers[0].MediaType) != LayerMediaType ||
		m.Annotations[AnnotationTemplate] != tmpl || m.Annotations[AnnotationGeneration] != gen {
		return hostile("%s is not a bothy template generation of %s/%s", Tag(tmpl, gen), tmpl, gen)
	}
	if m.Config.Size <= 0 || m.Config.Size > MaxConfigBytes {
		return hostile("the configuration of %s declares %d bytes (at most %d)", Tag(tmpl, gen), m.Config.Size, MaxConfigBytes)
	}
	if len(m.Layers) > r.limits.MaxEntries {
		return hostile("the manifest of %s lists %d blobs", Tag(tmpl, gen), len(m.Layers))
	}
	var total int64
	for i, l := range m.Layers {
		if l.Size <= 0 || (i > 0 && string(l.MediaType) != FileMediaType) {
			return hostile("the manifest of %s lists a blob of type %q and %d bytes", Tag(tmpl, gen), l.MediaType, l.Size)
		}
		total += l.Size
		if l.Size > r.limits.MaxBytes || total > r.limits.MaxBytes {
			return hostile("the payload of %s declares %d bytes or more (at most %d)", Tag(tmpl, gen), total, r.limits.MaxBytes)
		}
	}
	return nil
}

// blobReader is a blob being read, bounded and hashed; verify says, once it is read to its
// end, whether it was the blob its descriptor names.
type blobReader interface {
	io.ReadCloser
	verify() error
}

// readBlob reads a small blob whole and checks it against its descriptor.
func (r *Registry) readBlob(ctx context.Context, d v1.Descriptor, opts []remote.Option) ([]byte, error) {
	body, err := r.openBlob(ctx, d, opts)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	return data, body.verify()
}

// openBlob opens a blob for reading, bounded by its declared size and hashed as it is read.
func (r *Registry) openBlob(ctx context.Context, d v1.Descriptor, opts []remote.Option) (*checkedBlob, error) {
	if d.Digest.Algorithm != "sha256" || len(d.Digest.Hex) != 64 {
		return nil, hostile("a blob is named by %q, not a sha256 digest", d.Digest.String())
	}
	l, err := remote.Layer(r.repo.Digest(d.Digest.String()), opts...)
	if err != nil {
		return nil, unavailable(err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, unavailable(err)
	}
	return &checkedBlob{rc: rc, r: io.LimitReader(rc, d.Size+1), h: sha256.New(), want: d}, nil
}

// checkedBlob reads at most one byte past a blob's declared size and hashes what it reads;
// verify says whether that was the blob its descriptor names.
type checkedBlob struct {
	rc   io.ReadCloser
	r    io.Reader
	h    hash.Hash
	n    int64
	want v1.Descriptor
	// failed keeps a read's error: the library's own digest check fails the read at EOF.
	failed error
}

func (b *checkedBlob) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	if b.n > b.want.Size {
		return n, hostile("the blob %s is longer than the %d bytes its descriptor declares", b.want.Digest, b.want.Size)
	}
	if err != nil && err != io.EOF {
		b.failed = err
		if strings.Contains(err.Error(), "error verifying") { // go-containerregistry's own check
			return n, hostile("the blob %s is not what its digest names: %v", b.want.Digest, err)
		}
		return n, unavailable(err)
	}
	return n, err
}

func (b *checkedBlob) Close() error { return b.rc.Close() }

func (b *checkedBlob) verify() error {
	if b.n != b.want.Size {
		return hostile("the blob %s has %d bytes, not the %d its descriptor declares", b.want.Digest, b.n, b.want.Size)
	}
	if got := hex.EncodeToString(b.h.Sum(nil)); got != b.want.Digest.Hex {
		return hostile("the blob %s has the digest sha256:%s", b.want.Digest, got)
	}
	return nil
}

// blobLayer is a small blob held in memory, pushed as a layer.
type blobLayer struct {
	data []byte
	mt   types.MediaType
}

func (b *blobLayer) Digest() (v1.Hash, error)            { return digestOf(b.data), nil }
func (b *blobLayer) DiffID() (v1.Hash, error)            { return digestOf(b.data), nil }
func (b *blobLayer) Size() (int64, error)                { return int64(len(b.data)), nil }
func (b *blobLayer) MediaType() (types.MediaType, error) { return b.mt, nil }
func (b *blobLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.data)), nil
}
func (b *blobLayer) Uncompressed() (io.ReadCloser, error) { return b.Compressed() }

// payloadLayer is a generation's payload as a tar stream, made twice rather than spooled:
// once to learn its digest and size, once for each upload attempt. The stream is the same
// both times (writeArchive is deterministic and a generation's payload never changes), and a
// registry refuses an upload that does not match the digest.
type payloadLayer struct {
	dir    string
	blobs  *blobIndex
	digest v1.Hash
	size   int64
}

func (p *payloadLayer) measure() error {
	d, err := platform.OpenDir(p.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	h := sha256.New()
	cw := &countingWriter{w: h}
	if err := writeArchive(cw, d, p.blobs); err != nil {
		return err
	}
	p.size = cw.n
	p.digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func (p *payloadLayer) Digest() (v1.Hash, error) { return p.digest, nil }
func (p *payloadLayer) DiffID() (v1.Hash, error) { return p.digest, nil }
func (p *payloadLayer) Size() (int64, error)     { return p.size, nil }
func (p *payloadLayer) MediaType() (types.MediaType, error) {
	return types.MediaType(LayerMediaType), nil
}
func (p *payloadLayer) Uncompressed() (io.ReadCloser, error) {
	return p.Compressed()
}

func (p *payloadLayer) Compressed() (io.ReadCloser, error) {
	d, err := platform.OpenDir(p.dir)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		defer d.Close()
		pw.CloseWithError(writeArchive(pw, d, p.blobs))
	}()
	return pr, nil
}
