package tests

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
)

type secretJSON struct {
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at"`
	Bindings  []struct {
		Sandbox string   `json:"sandbox"`
		Hosts   []string `json:"hosts"`
	} `json:"bindings"`
}

// noTraceUnder fails t if any regular file under dir holds v.
func noTraceUnder(t *testing.T, dir, v string) {
	t.Helper()
	_ = filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() || fi.Size() > 64<<20 {
			return nil
		}
		data, err := os.ReadFile(path)
		if err == nil && bytes.Contains(data, []byte(v)) {
			t.Errorf("%s holds the secret's value", path)
		}
		return nil
	})
}

// TestSecretsAPIIsWriteOnly: a secret is created, listed, shown, rotated and deleted across a
// SIGKILL and a restart of bothyd; no answer, no log line and no file of the state root ever
// holds its value in the clear, a refused request included; the key file is 0600.
func TestSecretsAPIIsWriteOnly(t *testing.T) {
	const value = "sk-test-5d41402abc4b2a76b9719d911017c592"
	const rotated = "sk-test-rotated-7d793037a0760186574b0282f2f435e7"
	d := startDaemon(t)
	var answers [][]byte
	keep := func(r response) response { answers = append(answers, r.Body); return r }

	s := decode[secretJSON](t, keep(d.doJSON("POST", "/v1/secrets", map[string]any{"name": "API_KEY", "value": value})), 201)
	if s.Name != "API_KEY" || s.RotatedAt != nil || len(s.Bindings) != 0 {
		t.Fatalf("created %+v", s)
	}
	wantProblem(t, keep(d.doJSON("POST", "/v1/secrets", map[string]any{"name": "API_KEY", "value": value})), 409, "secret-exists")
	wantProblem(t, keep(d.doJSON("POST", "/v1/secrets", map[string]any{"name": "bad-name", "value": value})), 400, "invalid-request")
	wantProblem(t, keep(d.doJSON("POST", "/v1/secrets", map[string]any{"name": "LONG", "value": strings.Repeat(value, 300)})), 400, "invalid-request")
	fi, err := os.Stat(filepath.Join(d.Root, "secrets", "key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v, %v", fi, err)
	}

	d.Restart(true)
	list := decode[struct{ Items []secretJSON }](t, keep(d.doJSON("GET", "/v1/secrets", nil)), 200)
	if len(list.Items) != 1 || list.Items[0].Name != "API_KEY" {
		t.Fatalf("after a SIGKILL and restart: %+v", list)
	}
	r := decode[secretJSON](t, keep(d.doJSON("POST", "/v1/secrets/API_KEY/rotate", map[string]any{"value": rotated})), 200)
	if r.RotatedAt == nil || !r.CreatedAt.Equal(s.CreatedAt) {
		t.Fatalf("rotated %+v", r)
	}
	decode[secretJSON](t, keep(d.doJSON("GET", "/v1/secrets/API_KEY", nil)), 200)
	wantProblem(t, keep(d.doJSON("POST", "/v1/secrets/NONE/rotate", map[string]any{"value": rotated})), 404, "secret-not-found")

	for _, a := range answers {
		if bytes.Contains(a, []byte("sk-test")) {
			t.Errorf("an answer carries a value: %s", a)
		}
	}
	noTraceUnder(t, d.Root, value)
	noTraceUnder(t, d.Root, rotated)
	if strings.Contains(d.logs.String(), "sk-test") {
		t.Errorf("the log carries a value")
	}

	if r := d.do("DELETE", "/v1/secrets/API_KEY", nil, nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/secrets/API_KEY", nil, nil), 404, "secret-not-found")
}

// TestCheckRepairsSecretsLeftovers: what interrupted writes of a secret and of the egress CA
// leave is reported by `bothyd check` and removed by --repair; a secret's record without the
// key beside it is reported and kept; and the start-up removes the temporary files too.
func TestCheckRepairsSecretsLeftovers(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t)
	decode[secretJSON](t, d.doJSON("POST", "/v1/secrets", map[string]any{"name": "KEPT", "value": "kept-value-0123456789"}), 201)
	d.Stop()
	mustCheckClean(t, d.Root, "after a create")

	plant := func(dir, name string) string {
		p := filepath.Join(d.Root, dir, platform.TempName(name))
		if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tmpSecret, tmpCA := plant("secrets", "NEW.json"), plant("egress", "ca.key")
	r, code, stderr := runCheck(t, d.Root)
	if code != 1 || len(r.kinds()["secret-leftover"]) != 1 || len(r.kinds()["egress-leftover"]) != 1 {
		t.Fatalf("check with leftovers: exit %d %+v %s", code, r, stderr)
	}
	if _, code, stderr := runCheck(t, d.Root, "--repair"); code != 0 {
		t.Fatalf("repair: exit %d %s", code, stderr)
	}
	for _, p := range []string{tmpSecret, tmpCA} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the repair: %v", p, err)
		}
	}
	mustCheckClean(t, d.Root, "after the repair")

	// The start-up cleans them as well.
	tmpSecret, tmpCA = plant("secrets", "NEW.json"), plant("egress", "ca.crt")
	d.start()
	for _, p := range []string{tmpSecret, tmpCA} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the start-up: %v", p, err)
		}
	}
	if s := decode[secretJSON](t, d.doJSON("GET", "/v1/secrets/KEPT", nil), 200); s.Name != "KEPT" {
		t.Fatalf("after the start-up: %+v", s)
	}
	d.Stop()

	// A record without its key is reported, and kept.
	if err := os.Remove(filepath.Join(d.Root, "secrets", "key")); err != nil {
		t.Fatal(err)
	}
	r, code, _ = runCheck(t, d.Root, "--repair")
	if code == 0 || len(r.kinds()["secret-missing-key"]) != 1 {
		t.Fatalf("without the key: exit %d %+v", code, r)
	}
	if _, err := os.Stat(filepath.Join(d.Root, "secrets", "KEPT.json")); err != nil {
		t.Fatalf("the repair removed a record: %v", err)
	}
	d.start() // for the harness's clean-up
}
