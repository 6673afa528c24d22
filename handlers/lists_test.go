package handlers

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/secret"
	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/volume"
	"github.com/bothy/bothy/webhook"
)

// listImages is an image store that only lists.
type listImages []*supervisor.ImageInfo

func (l listImages) ListImages() ([]*supervisor.ImageInfo, error) { return l, nil }
func (listImages) Image(string) (*supervisor.ImageInfo, error) {
	return nil, errcode.New(errcode.ImageNotFound, "no")
}
func (listImages) PullImage(context.Context, supervisor.PullRequest) (*supervisor.ImageInfo, error) {
	return nil, errcode.New(errcode.NotImplemented, "no")
}
func (listImages) ImportImage(context.Context, string, io.Reader) (*supervisor.ImageInfo, error) {
	return nil, errcode.New(errcode.NotImplemented, "no")
}
func (listImages) DeleteImage(context.Context, string) error {
	return errcode.New(errcode.NotImplemented, "no")
}

// listHooks is a webhook manager that only lists, in the order it was given.
type listHooks []webhook.Webhook

func (listHooks) Create(webhook.CreateRequest) (*webhook.Webhook, error) {
	return nil, errcode.New(errcode.NotImplemented, "no")
}
func (listHooks) Get(string) (*webhook.Webhook, error) {
	return nil, errcode.New(errcode.NotImplemented, "no")
}
func (l listHooks) List() []webhook.Webhook { return l }
func (listHooks) Delete(string) error       { return errcode.New(errcode.NotImplemented, "no") }

// listSecrets is a secret store that only lists, in the order it was given.
type listSecrets []secret.Secret

func (listSecrets) Create(string, string) (*secret.Secret, error) {
	return nil, errcode.New(errcode.NotImplemented, "no")
}
func (listSecrets) Rotate(string, string) (*secret.Secret, error) {
	return nil, errcode.New(errcode.NotImplemented, "no")
}
func (listSecrets) Get(string) (*secret.Secret, error) {
	return nil, errcode.New(errcode.NotImplemented, "no")
}
func (l listSecrets) List() []secret.Secret { return l }
func (listSecrets) Delete(string) error     { return errcode.New(errcode.NotImplemented, "no") }

// pages walks a list a page of limit at a time from no cursor to the last page and returns
// the keys of every item in the order the pages gave them.
func pages(t *testing.T, s http.Handler, path string, limit int, key string) []string {
	t.Helper()
	var keys []string
	cursor := ""
	for range 20 {
		target := path + "?limit=" + strconv.Itoa(limit)
		if cursor != "" {
			target += "&cursor=" + url.QueryEscape(cursor)
		}
		code, body := do(t, s, "GET", target, "")
		var page struct {
			Items      []map[string]any `json:"items"`
			NextCursor *string          `json:"next_cursor"`
		}
		if err := json.Unmarshal(body, &page); err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %s", target, code, body)
		}
		if len(page.Items) > limit {
			t.Fatalf("%s: %d items, over the limit", target, len(page.Items))
		}
		for _, it := range page.Items {
			keys = append(keys, it[key].(string))
		}
		if page.NextCursor == nil {
			return keys
		}
		cursor = *page.NextCursor
	}
	t.Fatalf("%s: no last page after 20", path)
	return nil
}

// TestListsPaged: the image, webhook, volume and secret lists take limit and cursor as the
// other lists do: pages in key order (an image's name, a webhook's id, a volume's name, a
// secret's name in byte order), each item once, the last page without a cursor; an image's
// cursor may hold the '.' and '_' of an image's name, a secret's its upper case and '_'; a
// cursor outside the list's rule is refused 400. (Before, these lists refused limit as an
// unknown parameter.)
func TestListsPaged(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandlers(t, &fakeSupervisor{})
	h.cfg.Images = listImages{
		{Name: "host", Kind: supervisor.ImageKindHost, State: supervisor.ImageReady},
		{Name: "rootfs", Kind: supervisor.ImageKindDirectory, State: supervisor.ImageReady},
		{Name: "py_3.12", Kind: supervisor.ImageKindOCI, State: supervisor.ImageReady},
		{Name: "alpine", Kind: supervisor.ImageKindOCI, State: supervisor.ImagePulling},
		{Name: "busybox", Kind: supervisor.ImageKindOCI, State: supervisor.ImageReady},
	}
	h.cfg.Webhooks = listHooks{{ID: "wh-00000000000000c0"}, {ID: "wh-00000000000000a0"}, {ID: "wh-00000000000000b0"}}
	h.cfg.Secrets = listSecrets{{Name: "db"}, {Name: "Token"}, {Name: "z"}, {Name: "API_KEY"}, {Name: "a_b"}}
	s := newTestServer(t, h)
	if got := strings.Join(pages(t, s, "/v1/images", 2, "name"), ","); got != "alpine,busybox,host,py_3.12,rootfs" {
		t.Errorf("image pages held %s, want every image once in name order", got)
	}
	if got := strings.Join(pages(t, s, "/v1/webhooks", 2, "id"), ","); got != "wh-00000000000000a0,wh-00000000000000b0,wh-00000000000000c0" {
		t.Errorf("webhook pages held %s, want every webhook once in id order", got)
	}
	// A secret's name may hold upper case and '_', and byte order puts upper case first.
	if got := strings.Join(pages(t, s, "/v1/secrets", 2, "name"), ","); got != "API_KEY,Token,a_b,db,z" {
		t.Errorf("secret pages held %s, want every secret once in byte order of name", got)
	}
	for _, target := range []string{"/v1/images?cursor=-x", "/v1/webhooks?cursor=a.b", "/v1/volumes?cursor=A", "/v1/images?limit=0", "/v1/webhooks?limit=1001",
		"/v1/secrets?cursor=_a", "/v1/secrets?cursor=a-b", "/v1/secrets?limit=0"} {
		if code, body := do(t, s, "GET", target, ""); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", target, code, body)
		}
	}
}

// TestVolumesPaged: the volume list pages in name order, each volume once. Volumes are
// real (loop devices and mounts), so it needs root.
func TestVolumesPaged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("volumes need root (loop devices and mounts)")
	}
	vs, err := volume.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"c", "a", "b"} {
		if _, err := vs.Create(context.Background(), name, volume.MinSizeMB); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = vs.Delete(name) })
	}
	h, _ := newTestHandlers(t, &fakeSupervisor{})
	h.cfg.Volumes = vs
	if got := strings.Join(pages(t, newTestServer(t, h), "/v1/volumes", 2, "name"), ","); got != "a,b,c" {
		t.Errorf("volume pages held %s, want a,b,c", got)
	}
}
