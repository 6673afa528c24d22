package registry

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/template"
)

// The bounds a listing of the repository's tags holds a registry to: a generation has its
// own tag, its tombstone's and one mark (HeldTag) for each node that holds it, so these
// allow 64 thousand tags, some 16 thousand generations of all templates on two nodes each,
// and a registry that serves more is refused rather than read without end.
const (
	tagPageSize     = 1000
	maxTagPages     = 64
	maxTagPageBytes = 1 << 20
)

// Current is the current generation of template tmpl in the registry: the newest pushed
// (generation ids grow with each capture of a template, and a tag names a generation of
// one origin: [Registry.Push] refuses a second) whose tombstone the registry does not hold.
// It reads the repository's tag list only, bounded; the pull that follows checks the
// generation itself. A template the registry holds no live generation of is
// template-not-found.
func (r *Registry) Current(ctx context.Context, tmpl string) (string, error) {
	if err := template.ValidateName(tmpl); err != nil {
		return "", err
	}
	tags, err := r.tags(ctx)
	if err != nil {
		return "", err
	}
	prefix := tmpl + "."
	pushed := map[string]bool{}
	tombstoned := map[string]bool{}
	for _, tag := range tags {
		rest, ok := strings.CutPrefix(tag, prefix)
		if !ok {
			continue
		}
		if gen, ok := strings.CutSuffix(rest, ".tombstone"); ok {
			tombstoned[gen] = true
		} else if template.ValidateGeneration(rest) == nil {
			pushed[rest] = true
		}
	}
	cur := ""
	for gen := range pushed {
		if !tombstoned[gen] && template.NewerGeneration(gen, cur) {
			cur = gen
		}
	}
	if cur == "" {
		return "", errcode.New(errcode.TemplateNotFound, "Template %s is neither on this node nor in the template registry (no generation of it that is not tombstoned or retired); capture it first, or name a template that exists.", tmpl)
	}
	return cur, nil
}

// tags lists the repository's tags, page by page, each page's body bounded. A repository
// the registry does not know (nothing pushed yet) has none.
func (r *Registry) tags(ctx context.Context) ([]string, error) {
	base := r.transport
	if base == nil {
		base = remote.DefaultTransport
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.opts...)
	opts = append(opts, remote.WithTransport(boundedTagList{base}), remote.WithPageSize(tagPageSize))
	p, err := remote.NewPuller(opts...)
	if err != nil {
		return nil, err
	}
	l, err := p.Lister(ctx, r.repo)
	if err != nil {
		if notFound(err) {
			return nil, nil
		}
		return nil, listError(err)
	}
	var tags []string
	for pages := 0; l.HasNext(); pages++ {
		if pages == maxTagPages {
			return nil, refusedList("it runs past %d pages", maxTagPages)
		}
		page, err := l.Next(ctx)
		if err != nil {
			return nil, listError(err)
		}
		tags = append(tags, page.Tags...)
	}
	return tags, nil
}

// refusedList is the error of a registry whose tag list is past the bounds.
func refusedList(format string, args ...any) error {
	return errcode.New(errcode.RegistryRefused, "The template registry's list of tags is refused: "+format+"; the registry is not one bothy can use as it is.", args...)
}

// errTagPageTooLong is a tag list page longer than maxTagPageBytes.
var errTagPageTooLong = errors.New("registry: a tag list page is too long")

func listError(err error) error {
	if errors.Is(err, errTagPageTooLong) {
		return refusedList("a page is longer than %d bytes", maxTagPageBytes)
	}
	return unavailable(err)
}

// boundedTagList fails the read of a tag list's body past maxTagPageBytes, which
// go-containerregistry would otherwise decode whole, however long.
type boundedTagList struct{ base http.RoundTripper }

func (b boundedTagList) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.base.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/tags/list") {
		return resp, err
	}
	resp.Body = &boundedBody{rc: resp.Body, left: maxTagPageBytes}
	return resp, nil
}

type boundedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly the bound from a longer one.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			return 0, errTagPageTooLong
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }
