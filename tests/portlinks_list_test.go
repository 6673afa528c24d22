package tests

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

type linkInfoJSON struct {
	ID        string    `json:"id"`
	Sandbox   string    `json:"sandbox"`
	Port      int       `json:"port"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// TestPortLinkLists: the live links of a port and of a sandbox are listed after a create,
// leave the list when revoked or expired, never carry a token or a path, and an unknown
// sandbox answers 404; `bothy link ls` prints the same list.
func TestPortLinkLists(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("lister", false)
	mk := func(port, ttl int) linkJSON {
		t.Helper()
		return decode[linkJSON](t, d.doJSON("POST", "/v1/sandboxes/lister/ports/"+strconv.Itoa(port)+"/links", map[string]any{"ttl_s": ttl}), 201)
	}
	// list answers the ids listed at path, failing the test on any token or path in the body.
	list := func(path string) []string {
		t.Helper()
		r := d.do("GET", path, nil, nil)
		if r.Status != 200 {
			t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
		}
		var raw struct {
			Items []map[string]any `json:"items"`
		}
		if err := json.Unmarshal(r.Body, &raw); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, r.Body)
		}
		ids := []string{}
		for _, it := range raw.Items {
			for _, k := range []string{"token", "path"} {
				if _, ok := it[k]; ok {
					t.Fatalf("GET %s lists a link with its %s: %s", path, k, r.Body)
				}
			}
			ids = append(ids, it["id"].(string))
		}
		var typed struct {
			Items []linkInfoJSON `json:"items"`
		}
		_ = json.Unmarshal(r.Body, &typed)
		for _, it := range typed.Items {
			if it.Sandbox != "lister" || it.Port == 0 || !it.ExpiresAt.After(it.CreatedAt) {
				t.Fatalf("GET %s: a malformed item %+v", path, it)
			}
		}
		return ids
	}
	want := func(path string, ids ...string) {
		t.Helper()
		if got := list(path); strings.Join(got, ",") != strings.Join(ids, ",") {
			t.Fatalf("GET %s lists %v, want %v", path, got, ids)
		}
	}

	want("/v1/sandboxes/lister/links")
	want("/v1/sandboxes/lister/ports/8000/links")

	a := mk(8000, 600)
	b := mk(8001, 600)
	c := mk(8000, 600)
	for _, l := range []linkJSON{a, b, c} {
		for _, leak := range []string{l.Token, strings.SplitN(l.Token, ".", 2)[1]} {
			r := d.do("GET", "/v1/sandboxes/lister/links", nil, nil)
			if bytes.Contains(r.Body, []byte(leak)) {
				t.Fatalf("the list holds a link's token: %s", r.Body)
			}
		}
	}
	// Oldest first: a and c may share a second of creation, so their order is by id then.
	first, second := a.ID, c.ID
	if ids := list("/v1/sandboxes/lister/ports/8000/links"); len(ids) == 2 && ids[0] == c.ID {
		first, second = c.ID, a.ID
	}
	want("/v1/sandboxes/lister/ports/8000/links", first, second)
	want("/v1/sandboxes/lister/ports/8001/links", b.ID)
	if got := list("/v1/sandboxes/lister/links"); len(got) != 3 {
		t.Fatalf("the sandbox's links: %v, want 3", got)
	}
	want("/v1/sandboxes/lister/ports/9999/links")

	// bothy link ls, as JSON and by name.
	out, err := exec.Command(bothyBin, "--url", d.URL, "--token-file", d.tokenFile(t), "link", "ls", "lister", "8000", "-o", "json").CombinedOutput()
	var cli []linkInfoJSON
	if err != nil || json.Unmarshal(out, &cli) != nil || len(cli) != 2 || bytes.Contains(out, []byte(a.Token)) {
		t.Fatalf("bothy link ls -o json: %v: %s", err, out)
	}
	out, err = exec.Command(bothyBin, "--url", d.URL, "--token-file", d.tokenFile(t), "link", "ls", "lister", "-o", "name").CombinedOutput()
	if err != nil || len(strings.Fields(string(out))) != 3 {
		t.Fatalf("bothy link ls -o name: %v: %s", err, out)
	}

	// A revoked link leaves the lists.
	if r := d.do("DELETE", "/v1/sandboxes/lister/ports/8000/links/"+a.ID, nil, nil); r.Status != 204 {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	want("/v1/sandboxes/lister/ports/8000/links", c.ID)
	if got := list("/v1/sandboxes/lister/links"); strings.Contains(strings.Join(got, ","), a.ID) || len(got) != 2 {
		t.Fatalf("after a revocation the sandbox lists %v", got)
	}

	// An expired one too.
	short := mk(8002, 1)
	waitFor(t, 30*time.Second, "the short link to leave the list", func() bool {
		return len(list("/v1/sandboxes/lister/ports/8002/links")) == 0
	})
	if got := list("/v1/sandboxes/lister/links"); strings.Contains(strings.Join(got, ","), short.ID) {
		t.Fatalf("an expired link is listed: %v", got)
	}

	// A sandbox made again under the same id inherits no link of the old one.
	if r := d.do("DELETE", "/v1/sandboxes/lister?force=true", nil, nil); r.Status/100 != 2 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/lister/links", nil, nil), 404, "sandbox-not-found")
	d.create("lister", false)
	want("/v1/sandboxes/lister/links")

	// Unknown sandboxes and bad ports.
	wantProblem(t, d.do("GET", "/v1/sandboxes/nosuch/links", nil, nil), 404, "sandbox-not-found")
	wantProblem(t, d.do("GET", "/v1/sandboxes/nosuch/ports/8000/links", nil, nil), 404, "sandbox-not-found")
	wantProblem(t, d.do("GET", "/v1/sandboxes/lister/ports/0/links", nil, nil), 400, "invalid-request")
}
