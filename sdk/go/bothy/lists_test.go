package bothy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestListsFollowPages: Volumes, Webhooks, Images and Secrets follow next_cursor to the last page,
// sending it as cursor, and return every page's items.
func TestListsFollowPages(t *testing.T) {
	t.Parallel()
	var seen []string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.Path+"?"+r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/json")
		key := map[string]string{"/v1/volumes": "name", "/v1/webhooks": "id", "/v1/images": "name", "/v1/secrets": "name"}[r.URL.Path]
		first, second := "a", "b"
		if key == "id" {
			first, second = "wh-000000000000000a", "wh-000000000000000b"
		}
		if r.URL.Query().Get("cursor") == "" {
			_, _ = io.WriteString(w, `{"items":[{"`+key+`":"`+first+`"}],"next_cursor":"`+first+`"}`)
			return
		}
		_, _ = io.WriteString(w, `{"items":[{"`+key+`":"`+second+`"}]}`)
	}))
	ctx := context.Background()
	vols, err := c.Volumes(ctx)
	if err != nil || len(vols) != 2 || vols[0].Name != "a" || vols[1].Name != "b" {
		t.Fatalf("Volumes: %+v, %v", vols, err)
	}
	hooks, err := c.Webhooks(ctx)
	if err != nil || len(hooks) != 2 || hooks[1].ID != "wh-000000000000000b" {
		t.Fatalf("Webhooks: %+v, %v", hooks, err)
	}
	images, err := c.Images(ctx)
	if err != nil || len(images) != 2 || images[1].Name != "b" {
		t.Fatalf("Images: %+v, %v", images, err)
	}
	secrets, err := c.Secrets(ctx)
	if err != nil || len(secrets) != 2 || secrets[0].Name != "a" || secrets[1].Name != "b" {
		t.Fatalf("Secrets: %+v, %v", secrets, err)
	}
	want := "/v1/volumes?\n/v1/volumes?cursor=a\n/v1/webhooks?\n/v1/webhooks?cursor=wh-000000000000000a\n/v1/images?\n/v1/images?cursor=a\n/v1/secrets?\n/v1/secrets?cursor=a"
	if got := strings.Join(seen, "\n"); got != want {
		t.Fatalf("requests:\n%s\nwant:\n%s", got, want)
	}
}
