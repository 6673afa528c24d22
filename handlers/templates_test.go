package handlers

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// TestTemplateNotFound: the supervisor's not-found codes are the API's 404s, on every read.
func TestTemplateNotFound(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandlers(t, &fakeSupervisor{templates: []supervisor.Template{{Name: "base"}}})
	s := newTestServer(t, h)
	for target, want := range map[string]errcode.Code{
		"/v1/templates/nope":                     errcode.TemplateNotFound,
		"/v1/templates/base/generations/g000009": errcode.GenerationNotFound,
	} {
		code, body := do(t, s, "GET", target, "")
		if p := problemOf(t, body); code != http.StatusNotFound || p.Code != string(want) {
			t.Errorf("%s: %d %+v, want 404 %s", target, code, p, want)
		}
	}
	for _, target := range []string{"/v1/templates", "/v1/templates/base/generations", "/v1/templates/base/generations/g000001/leases"} {
		f := &fakeSupervisor{err: errcode.New(errcode.TemplateNotFound, "There is no template base.")}
		h, _ := newTestHandlers(t, f)
		code, body := do(t, newTestServer(t, h), "GET", target, "")
		if p := problemOf(t, body); code != http.StatusNotFound || p.Code != string(errcode.TemplateNotFound) {
			t.Errorf("%s: %d %+v, want 404 template-not-found", target, code, p)
		}
	}
}

// TestTemplatesPaged: templates and generations are paged in name order with opaque cursors.
func TestTemplatesPaged(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{
		templates: []supervisor.Template{{Name: "c"}, {Name: "a", Latest: "g000002", Generations: 2}, {Name: "b"}},
		gens:      []supervisor.Generation{{ID: "g000002", Template: "a"}, {ID: "g000001", Template: "a"}},
	}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)

	var names []string
	cursor := ""
	for page := 0; page < 5; page++ {
		target := "/v1/templates?limit=2"
		if cursor != "" {
			target += "&cursor=" + cursor
		}
		code, body := do(t, s, "GET", target, "")
		var l openapi.TemplateList
		if err := json.Unmarshal(body, &l); err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %s", target, code, body)
		}
		for _, tm := range l.Items {
			names = append(names, tm.Name)
			if tm.Name == "a" && (tm.Latest == nil || *tm.Latest != "g000002" || tm.Generations != 2) {
				t.Errorf("template a: %+v", tm)
			}
			if tm.Name == "b" && tm.Latest != nil {
				t.Errorf("template b has no latest, shows %q", *tm.Latest)
			}
		}
		if l.NextCursor == nil {
			break
		}
		cursor = *l.NextCursor
	}
	if strings.Join(names, ",") != "a,b,c" {
		t.Errorf("pages held %v, want a,b,c once each", names)
	}

	code, body := do(t, s, "GET", "/v1/templates/a/generations?limit=1", "")
	var l openapi.GenerationList
	if err := json.Unmarshal(body, &l); err != nil || code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if len(l.Items) != 1 || l.Items[0].ID != "g000001" || l.NextCursor == nil {
		t.Errorf("first page of generations %+v", l)
	}
}

// TestGenerationView: a generation reads as the contract's, its key without a disk.
func TestGenerationView(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	g := apiGeneration(&supervisor.Generation{
		ID: "g000001", Template: "base", State: "tombstoned", Eligibility: "expired", CapturedAt: at, SizeBytes: 4096, Leases: 2,
	})
	g2 := apiGeneration(&supervisor.Generation{ID: "g000002"})
	if g.State != openapi.GenerationStateTombstoned || g.Eligibility != openapi.GenerationEligibilityExpired ||
		g.SizeBytes != 4096 || g.Leases != 2 || !g.CapturedAt.Equal(at) || g2.Key.Resources.DiskMb != 0 {
		t.Errorf("generation view %+v", g)
	}
}

// TestRetireOutcomes: a retirement that waits for leases answers 202 with what retires, a
// finished one 204.
func TestRetireOutcomes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		outcome supervisor.RetireOutcome
		code    int
	}{{supervisor.Draining, http.StatusAccepted}, {supervisor.Retired, http.StatusNoContent}} {
		h, _ := newTestHandlers(t, &fakeSupervisor{outcome: tc.outcome,
			templates: []supervisor.Template{{Name: "base", Generations: 1}},
			gens:      []supervisor.Generation{{ID: "g000001", Template: "base", State: "retiring", Eligibility: "retiring", Leases: 2}}})
		s := newTestServer(t, h)
		for target, want := range map[string]string{"/v1/templates/base?drain=true": `"name":"base"`, "/v1/templates/base/generations/g000001?drain=true": `"state":"retiring"`} {
			code, body := do(t, s, "DELETE", target, "")
			if code != tc.code {
				t.Errorf("%s with %v: %d %s, want %d", target, tc.outcome, code, body, tc.code)
			}
			if code == http.StatusAccepted && !strings.Contains(string(body), want) {
				t.Errorf("%s: 202 with %s, want it to hold %s", target, body, want)
			}
		}
	}
}

// TestLeases: a generation's leases are listed as they are.
func TestLeases(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	h, _ := newTestHandlers(t, &fakeSupervisor{leases: []supervisor.Lease{{ID: "l1", Sandbox: "c1", AcquiredAt: at}}})
	code, body := do(t, newTestServer(t, h), "GET", "/v1/templates/base/generations/g000001/leases", "")
	var l openapi.LeaseList
	if err := json.Unmarshal(body, &l); err != nil || code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if len(l.Items) != 1 || l.Items[0].ID != "l1" || l.Items[0].Sandbox != "c1" || !l.Items[0].AcquiredAt.Equal(at) {
		t.Errorf("leases %+v", l.Items)
	}
}

// TestCreateTemplate: a created template answers 201 with its location.
func TestCreateTemplate(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandlers(t, &fakeSupervisor{})
	s := newTestServer(t, h)
	req := newRequest("POST", "/v1/templates", `{"name":"base"}`)
	rec := serve(s, req)
	if rec.Code != http.StatusCreated || rec.Header().Get("Location") != "/v1/templates/base" {
		t.Errorf("%d, Location %q", rec.Code, rec.Header().Get("Location"))
	}
}
