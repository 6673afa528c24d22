// Package registry pulls images with the OCI distribution protocol, through
// github.com/google/go-containerregistry: it resolves a reference (a manifest list to one
// platform), authenticates (anonymously, with a token the registry hands out, or with
// credentials from a docker-style config.json) and returns the image as an
// [image.Source] whose layers are downloaded only when the image store opens them.
//
// A registry is not trusted: every request of a pull goes through a RoundTripper of this
// package that bounds redirects and the bodies the pull holds in memory, and a manifest is
// held to bounds on what it declares before anything it names is read (bounds.go).
//
// It is the HTTP client side of images and nothing else: it writes nothing to disk (the
// image store unpacks and checks), and the store knows it only as an [image.Fetcher]. It is
// apart from store/image because it links net/http, which no package below the handlers
// may; the command that builds the server wires a [Registry] into the store's Options.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/store/image"
)

// Options configure a [Registry].
type Options struct {
	// AuthFile is a docker-style config.json ("auths" with base64 user:password, or
	// identity tokens); empty for anonymous pulls (registries still hand out tokens for
	// public repositories, which the library asks for).
	AuthFile string
	// Insecure lists registries ("host" or "host:port") spoken to over plain HTTP. A
	// loopback registry (localhost, 127.0.0.0/8, ::1) is always allowed plain HTTP, as
	// the library and docker do.
	Insecure []string
	// Mirror is a registry ("host" or "host:port") that pulls from Docker Hub go to first:
	// a reference whose registry is Docker Hub (index.docker.io, docker.io, or none given)
	// is rewritten to the same repository and tag or digest on the mirror. Only when the
	// mirror has no such image (404) or cannot be reached (a network failure, a 5xx) is Docker
	// Hub asked instead; a mirror that refuses credentials or serves a bad manifest is an
	// error, as a registry's own would be. The choice is made while the manifest is resolved,
	// before any layer is read, so every layer of an image comes from the registry whose
	// manifest named it; a layer download that fails on the mirror fails the pull.
	Mirror string
	// Platform is the "os/arch[/variant]" a manifest list is resolved to; the host's when
	// empty.
	Platform string
	// Transport, when set, carries the requests (tests give an httptest server's).
	Transport http.RoundTripper
}

// Registry is an [image.Fetcher] over the distribution protocol.
type Registry struct {
	opts     Options
	keychain authn.Keychain
	platform v1.Platform
}

var _ image.Fetcher = (*Registry)(nil)

// New makes a Registry, reading and checking opts.AuthFile now, so that a bad file is
// reported at start rather than at the first pull.
func New(opts Options) (*Registry, error) {
	want := opts.Platform
	if want == "" {
		want = image.HostPlatform()
	}
	p, err := v1.ParsePlatform(want)
	if err != nil {
		return nil, errcode.Invalid("platform", "The platform %q is not of the form os/arch[/variant].", want)
	}
	if opts.Mirror != "" {
		if _, err := name.NewRegistry(opts.Mirror); err != nil || strings.Contains(opts.Mirror, "/") {
			return nil, errcode.Invalid("mirror", "The registry mirror %q is not a host or host:port.", opts.Mirror)
		}
	}
	r := &Registry{opts: opts, keychain: authn.NewMultiKeychain(), platform: *p}
	if opts.AuthFile != "" {
		kc, err := loadAuthFile(opts.AuthFile)
		if err != nil {
			return nil, err
		}
		r.keychain = kc
	}
	return r, nil
}

// authFile is the part of a docker config.json that holds credentials.
type authFile struct {
	Auths map[string]authn.AuthConfig `json:"auths"`
}

// fileKeychain answers the credentials of a config.json, matched by registry host.
type fileKeychain struct{ auths map[string]authn.AuthConfig }

func loadAuthFile(path string) (*fileKeychain, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("registry: read the registry credentials %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, record.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("registry: read the registry credentials %s: %w", path, err)
	}
	if len(data) > record.MaxSize {
		return nil, fmt.Errorf("registry: the registry credentials %s are larger than %d bytes", path, record.MaxSize)
	}
	var af authFile
	if err := json.Unmarshal(data, &af); err != nil {
		return nil, fmt.Errorf("registry: the registry credentials %s are not a docker config.json: %w", path, err)
	}
	kc := &fileKeychain{auths: make(map[string]authn.AuthConfig)}
	for k, v := range af.Auths {
		kc.auths[authKey(k)] = v
	}
	return kc, nil
}

// authKey reduces a config.json key ("https://index.docker.io/v1/", "ghcr.io") to a host.
func authKey(k string) string {
	k = strings.TrimPrefix(strings.TrimPrefix(k, "https://"), "http://")
	k, _, _ = strings.Cut(k, "/")
	if k == "index.docker.io" || k == "docker.io" {
		return name.DefaultRegistry
	}
	return k
}

func (kc *fileKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	cfg, ok := kc.auths[authKey(res.RegistryStr())]
	if !ok {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(cfg), nil
}

// isLoopback reports whether a registry host:port is this machine.
func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// parse parses ref, allowing plain HTTP for loopback and the Insecure registries.
func (r *Registry) parse(ref string) (name.Reference, error) {
	var nopts []name.Option
	reg := ref
	if i := strings.IndexByte(ref, '/'); i > 0 {
		reg = ref[:i]
	}
	for _, h := range r.opts.Insecure {
		if h == reg {
			nopts = append(nopts, name.Insecure)
		}
	}
	if isLoopback(reg) {
		nopts = append(nopts, name.Insecure)
	}
	parsed, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, errcode.Invalid("ref", "The image reference %q is not valid: %v.", ref, err)
	}
	return parsed, nil
}

// Fetch resolves ref to one image for the configured platform and returns its parts. Only
// the manifest and the configuration are read now; each layer is downloaded when opened,
// and go-containerregistry checks the blob against its digest as it is read (the image
// store checks both digests again as it unpacks). A Docker Hub reference goes to the
// mirror first, when there is one (see [Options.Mirror]).
func (r *Registry) Fetch(ctx context.Context, ref string) (*image.Source, error) {
	parsed, err := r.parse(ref)
	if err != nil {
		return nil, err
	}
	if mirrored, ok, err := r.mirrored(parsed); err != nil {
		return nil, err
	} else if ok {
		src, err := r.fetch(ctx, ref, ref+" (on the mirror "+r.opts.Mirror+")", mirrored)
		if err == nil || !mirrorMissed(err) {
			return src, err
		}
	}
	return r.fetch(ctx, ref, ref, parsed)
}

// mirrored is parsed on the mirror, when there is one and parsed names Docker Hub.
func (r *Registry) mirrored(parsed name.Reference) (name.Reference, bool, error) {
	if r.opts.Mirror == "" || parsed.Context().RegistryStr() != name.DefaultRegistry {
		return nil, false, nil
	}
	sep := ":"
	if _, ok := parsed.(name.Digest); ok {
		sep = "@"
	}
	m, err := r.parse(r.opts.Mirror + "/" + parsed.Context().RepositoryStr() + sep + parsed.Identifier())
	return m, err == nil, err
}

// mirrorMissed reports whether a mirror's failure leaves Docker Hub to be asked: it has no
// such image, or it could not be reached. A cancelled pull is no miss.
func mirrorMissed(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	code := errcode.Of(err)
	return code == errcode.ImageNotFound || code == errcode.Unavailable
}

// fetch is [Registry.Fetch] from parsed, which is ref or ref rewritten to the mirror; label
// names it in errors. Every request goes through a [guard], and the manifest is held to the
// bounds before anything it names is read (see MaxManifestBytes and the others).
func (r *Registry) fetch(ctx context.Context, ref, label string, parsed name.Reference) (*image.Source, error) {
	g := newGuard(r.base())
	fail := func(err error) error {
		if b := g.broken(); b != nil {
			return b
		}
		return fetchError(label, err)
	}
	ropts := []remote.Option{
		remote.WithContext(ctx), remote.WithAuthFromKeychain(r.keychain), remote.WithPlatform(r.platform),
		remote.WithTransport(g), remote.WithRetryBackoff(retryBackoff),
	}
	img, err := remote.Image(parsed, ropts...)
	if err != nil {
		return nil, fail(err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, fail(err)
	}
	manifest, err := img.Manifest()
	if err != nil {
		return nil, fail(err)
	}
	if err := checkManifest(label, manifest); err != nil {
		return nil, err
	}
	g.expectConfig(manifest.Config.Digest.String())
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, fail(err)
	}
	src := &image.Source{Ref: ref, ManifestDigest: digest.String(), Config: config, ConfigDigest: manifest.Config.Digest.String()}
	for _, d := range manifest.Layers {
		l, err := img.LayerByDigest(d.Digest)
		if err != nil {
			return nil, fail(err)
		}
		src.Layers = append(src.Layers, image.SourceLayer{
			Digest: d.Digest.String(), Size: d.Size,
			Open: func(context.Context) (io.ReadCloser, error) {
				rc, err := l.Compressed()
				if err != nil {
					return nil, fail(err)
				}
				return rc, nil
			},
		})
	}
	return src, nil
}

// base is the transport under the guard: the configured one (tests give an httptest
// server's), or go-containerregistry's default with response headers bounded.
func (r *Registry) base() http.RoundTripper {
	if r.opts.Transport != nil {
		return r.opts.Transport
	}
	if t, ok := remote.DefaultTransport.(*http.Transport); ok {
		t = t.Clone()
		t.MaxResponseHeaderBytes = maxHeaderBytes
		return t
	}
	return remote.DefaultTransport
}

// checkManifest holds a parsed manifest to the bounds on what it declares: the number of
// layers, the sizes of the configuration and of the layers. A size must be declared: a
// negative one would let go-containerregistry read a blob without bound.
func checkManifest(label string, m *v1.Manifest) error {
	tooLarge := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		return errcode.Wrap(errcode.PayloadTooLarge, fmt.Errorf("%w: %w: %s", errBound, image.ErrTooLarge, msg),
			"The image %s is beyond a bound of bothyd: %s.", label, msg)
	}
	if n := len(m.Layers); n > image.MaxLayers {
		return tooLarge("its manifest lists %d layers, more than the %d bothyd pulls", n, image.MaxLayers)
	}
	if m.Config.Size < 0 || m.Config.Size > MaxConfigBytes {
		return tooLarge("its manifest declares a configuration of %d bytes, not 0 to %d", m.Config.Size, MaxConfigBytes)
	}
	var total int64
	for i, l := range m.Layers {
		if l.Size < 0 {
			return tooLarge("its manifest declares layer %d of %d bytes", i, l.Size)
		}
		total += l.Size
		if total > MaxImageBytes || total < 0 {
			return tooLarge("its manifest declares layers of more than %d bytes in all", int64(MaxImageBytes))
		}
	}
	return nil
}

// fetchError gives a registry failure a code the API can map: an unknown image, refused
// credentials, an unreachable registry.
func fetchError(ref string, err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusNotFound:
			return errcode.Wrap(errcode.ImageNotFound, err, "The registry has no image %s; check the name and tag.", ref)
		case http.StatusUnauthorized, http.StatusForbidden:
			return errcode.Wrap(errcode.Forbidden, err, "The registry refused access to %s; give credentials with --registry-auth.", ref)
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errcode.Wrap(errcode.Unavailable, err, "The image %s could not be fetched from its registry: %v.", ref, err)
}

// Keychain reads a docker-style config.json as New does for AuthFile, for the other clients
// of a registry in bothyd (the template registry) that take their credentials from the same
// kind of file.
func Keychain(path string) (authn.Keychain, error) { return loadAuthFile(path) }
