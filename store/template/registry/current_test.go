//go:build linux

package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/template"
)

// putTag tags a small manifest that is no generation as tag, as another tool might.
func putTag(t testing.TB, reg *testRegistry, tag string) {
	t.Helper()
	repo, err := name.NewRepository(reg.repo(), name.Insecure)
	must(t, err)
	cfg := []byte(`{}`)
	must(t, remote.WriteLayer(repo, &blobLayer{data: cfg, mt: ConfigMediaType}))
	raw, err := json.Marshal(manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Config: descriptorOf(cfg, ConfigMediaType), Layers: []v1.Descriptor{}})
	must(t, err)
	must(t, remote.Put(repo.Tag(tag), rawManifest(raw)))
}

// TestCurrent: the registry's current generation of a template is its newest pushed one
// without a tombstone; tags of other templates and tags that are no generation's do not count.
func TestCurrent(t *testing.T) {
	reg := newTestRegistry(t)
	a := openStore(t)
	ra, err := New(Options{Repository: reg.repo()}, a)
	must(t, err)
	rb, err := New(Options{Repository: reg.repo()}, openStore(t))
	must(t, err)
	if _, err := rb.Current(ctx(t), "base"); errcode.Of(err) != errcode.TemplateNotFound {
		t.Fatalf("Current of an empty repository: %v, want template-not-found", err)
	}
	g1 := captured(t, a)
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "second"), []byte("two\n"), 0o644))
	g2, err := a.Capture(ctx(t), "base", src, template.Key{Runtime: "namespace/test", Image: "host"}, nil)
	must(t, err)
	for _, g := range []string{g1, g2.ID} {
		if _, err := ra.Push(ctx(t), "base", g); err != nil {
			t.Fatal(err)
		}
	}
	for _, tag := range []string{"base-2.g000009", "ba.g000008", "base.g0000010", "base.g000011x", "base.latest"} {
		putTag(t, reg, tag)
	}
	steps := []struct {
		name string
		do   func() error
		want string // "" for template-not-found
	}{
		{"the newest", func() error { return nil }, "g000002"},
		{"the newest tombstoned", func() error { return ra.Tombstone(ctx(t), "base", "g000002", false) }, "g000001"},
		{"every one retired", func() error { return ra.Tombstone(ctx(t), "base", "g000001", true) }, ""},
	}
	for _, s := range steps {
		must(t, s.do())
		got, err := rb.Current(ctx(t), "base")
		if s.want == "" {
			if errcode.Of(err) != errcode.TemplateNotFound {
				t.Fatalf("%s: Current = %q, %v; want template-not-found", s.name, got, err)
			}
			continue
		}
		if err != nil || got != s.want {
			t.Fatalf("%s: Current = %q, %v; want %s", s.name, got, err, s.want)
		}
	}
}

// TestCurrentHostileTagList: a registry whose tag list is longer than the bounds, in one
// page or in pages without end, is refused, and one that is down is unavailable.
func TestCurrentHostileTagList(t *testing.T) {
	t.Parallel()
	long := func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"name":"bothy/templates","tags":["`)
		chunk := strings.Repeat("a", 1<<16)
		for range 2 * maxTagPageBytes / len(chunk) {
			if _, err := fmt.Fprint(w, chunk); err != nil {
				return
			}
		}
		fmt.Fprint(w, `"]}`)
	}
	endless := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", fmt.Sprintf(`</v2/bothy/templates/tags/list?n=1000&last=%s-x>; rel="next"`, r.URL.Query().Get("last")))
		fmt.Fprint(w, `{"name":"bothy/templates","tags":["base.g000001"]}`)
	}
	tests := []struct {
		name  string
		pages http.HandlerFunc
		want  errcode.Code
	}{
		{"a page too long", long, errcode.RegistryRefused},
		{"pages without end", endless, errcode.RegistryRefused},
		{"down", nil, errcode.RegistryUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v2/" {
					return
				}
				if strings.HasSuffix(r.URL.Path, "/tags/list") {
					tt.pages(w, r)
					return
				}
				http.NotFound(w, r)
			}))
			t.Cleanup(srv.Close)
			if tt.pages == nil {
				srv.Close()
			}
			r, err := New(Options{Repository: strings.TrimPrefix(srv.URL, "http://") + "/bothy/templates"}, openStore(t))
			must(t, err)
			if got, err := r.Current(ctx(t), "base"); errcode.Of(err) != tt.want {
				t.Fatalf("Current = %q, %v (%s); want %s", got, err, errcode.Of(err), tt.want)
			}
		})
	}
}

// BenchmarkCurrent is what a clone naming only a template pays on a node with a registry:
// one listing of a repository of 200 tags (100 generations and their tombstones' worth) on
// loopback.
func BenchmarkCurrent(b *testing.B) {
	reg := newTestRegistry(b)
	for i := range 200 {
		putTag(b, reg, fmt.Sprintf("base.g%06d", i+1))
	}
	r, err := New(Options{Repository: reg.repo()}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		if _, err := r.Current(ctx, "base"); err != nil {
			b.Fatal(err)
		}
	}
}
