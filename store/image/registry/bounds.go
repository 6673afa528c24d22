package registry

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/image"
)

// The bounds a pull holds a registry to, whatever it sends. A registry is not trusted: it
// may redirect a request to itself forever, serve a manifest of any size, declare a
// configuration of any size or an image of any number of layers. go-containerregistry bounds
// some of this (manifests at 100 MiB, token and error bodies) but follows redirects without a
// count (its redirect check only refuses private addresses) and reads a configuration of a
// size the manifest declares; these bounds are enforced by [guard], the RoundTripper every
// request of a pull goes through, and by [Registry.Fetch] once the manifest is parsed.
const (
	// MaxRedirects bounds the redirects one request follows. Registries redirect blobs to a
	// storage host (one hop) and registry.k8s.io redirects every request to a regional
	// registry (one hop, then perhaps a second to storage); five is room enough.
	MaxRedirects = 5
	// MaxManifestBytes bounds a manifest or an index: 4 MiB is the limit the OCI distribution
	// specification names as common among registries, and what containerd reads.
	MaxManifestBytes = 4 << 20
	// MaxConfigBytes bounds an image configuration. Real ones are kilobytes; a long history
	// of a hundred layers is well under a megabyte.
	MaxConfigBytes = 8 << 20
	// MaxImageBytes bounds the layers' declared sizes added up (the compressed bytes a pull
	// downloads), as an import's archive is bounded. go-containerregistry refuses a blob
	// longer than its declared size, so the declared total bounds what is read.
	MaxImageBytes = image.DefaultMaxArchiveBytes
	// maxHeaderBytes bounds a response's headers (net/http's default is 10 MB).
	maxHeaderBytes = 1 << 20
)

// retryBackoff is how a pull retries a request that failed for a reason that may pass (a
// reset connection, a 429 or a 5xx): three tries in all, one second then three seconds
// apart. It is go-containerregistry's default, set here so that the bound is ours to
// document and not a library's to change.
var retryBackoff = remote.Backoff{Duration: time.Second, Factor: 3, Jitter: 0.1, Steps: 3}

// errBound is wrapped by every refusal of a registry beyond a bound; it is not temporary,
// so the retrying transport does not try the request again.
var errBound = errors.New("registry beyond a bound")

// guard is the RoundTripper below go-containerregistry's transports (authentication and
// retries) for one Fetch: it sees every request the pull sends, redirect hops included, and
// every response before the library reads it. It refuses a redirect chain longer than
// MaxRedirects and a redirect that leaves HTTPS, and caps the bodies of manifests (every
// request for /v2/<name>/manifests/<ref>, and the redirect hops that follow one) and of the
// configuration blob. The first bound broken is kept so that Fetch reports it whatever the
// library wrapped it in.
type guard struct {
	next http.RoundTripper

	mu      sync.Mutex
	config  string // the digest of the configuration blob, once the manifest is known
	refused error
}

func newGuard(next http.RoundTripper) *guard { return &guard{next: next} }

// expectConfig tells the guard which blob is the configuration, whose body is capped at
// MaxConfigBytes.
func (g *guard) expectConfig(digest string) {
	g.mu.Lock()
	g.config = digest
	g.mu.Unlock()
}

// refuse records err as the bound that was broken (the first one wins) and returns it.
func (g *guard) refuse(code errcode.Code, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	cause := fmt.Errorf("%w: %s", errBound, msg)
	if code == errcode.PayloadTooLarge {
		cause = fmt.Errorf("%w: %w: %s", errBound, image.ErrTooLarge, msg)
	}
	err := errcode.Wrap(code, cause, "%s", msg)
	g.mu.Lock()
	if g.refused == nil {
		g.refused = err
	}
	g.mu.Unlock()
	return err
}

// broken returns the first bound broken, or nil.
func (g *guard) broken() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused
}

// origin returns the first request of the redirect chain req is a hop of (req itself when it
// is no redirect), and the number of redirects that led to req. net/http's client sets
// Response on each hop to the redirect that caused it, and the transport sets that
// response's Request to the hop before.
func origin(req *http.Request) (*http.Request, int) {
	first, hops := req, 0
	for first.Response != nil && first.Response.Request != nil && hops <= MaxRedirects {
		first = first.Response.Request
		hops++
	}
	if first.Response != nil { // the chain goes on beyond what was walked, or cannot be
		hops++
	}
	return first, hops
}

func (g *guard) RoundTrip(req *http.Request) (*http.Response, error) {
	first, hops := origin(req)
	if hops > MaxRedirects {
		return nil, g.refuse(errcode.Unavailable, "The registry redirected a request for %s more than %d times; it is misconfigured or hostile.", first.URL.Redacted(), MaxRedirects)
	}
	if hops > 0 && req.URL.Scheme != "https" && !(req.URL.Scheme == "http" && first.URL.Scheme == "http") {
		return nil, g.refuse(errcode.Unavailable, "The registry redirected a request for %s to %s, which is not HTTPS; bothyd does not leave HTTPS.", first.URL.Redacted(), req.URL.Redacted())
	}
	resp, err := g.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	limit, what := g.limitOf(first)
	if limit == 0 || req.Method == http.MethodHead {
		return resp, nil
	}
	if resp.ContentLength > limit {
		resp.Body.Close()
		return nil, g.refuse(errcode.PayloadTooLarge, "The registry's %s for %s is %d bytes, more than the %d bytes bothyd reads.", what, first.URL.Redacted(), resp.ContentLength, limit)
	}
	resp.Body = &capped{ReadCloser: resp.Body, left: limit, over: func() error {
		return g.refuse(errcode.PayloadTooLarge, "The registry's %s for %s is larger than the %d bytes bothyd reads.", what, first.URL.Redacted(), limit)
	}}
	return resp, nil
}

// limitOf is the cap on the body of a response to req (the first request of its chain), 0
// for none (a layer blob: the image store streams it to disk under its own bounds). The
// path of a distribution request is /v2/<name>/<kind>/<reference>, the name having slashes
// of its own.
func (g *guard) limitOf(req *http.Request) (int64, string) {
	p := req.URL.Path
	if !strings.HasPrefix(p, "/v2/") {
		return 0, ""
	}
	rest, ref, ok := cutLast(p)
	if !ok {
		return 0, ""
	}
	_, kind, ok := cutLast(rest)
	if !ok {
		return 0, ""
	}
	switch kind {
	case "manifests":
		return MaxManifestBytes, "manifest"
	case "blobs":
		g.mu.Lock()
		isConfig := g.config != "" && ref == g.config
		g.mu.Unlock()
		if isConfig {
			return MaxConfigBytes, "image configuration"
		}
	}
	return 0, ""
}

func cutLast(p string) (before, after string, ok bool) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", "", false
	}
	return p[:i], p[i+1:], true
}

// capped reads at most left bytes of a body, and fails the read that would go beyond.
type capped struct {
	io.ReadCloser
	left int64
	over func() error
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, c.over()
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.ReadCloser.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return 0, c.over()
	}
	return n, err
}
