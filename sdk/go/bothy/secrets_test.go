package bothy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestSecrets: the secret calls reach their routes with their bodies, and a refusal comes back
// as its code.
func TestSecrets(t *testing.T) {
	t.Parallel()
	var seen []string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+r.URL.Path+" "+string(body))
		w.Header().Set("Content-Type", "application/json")
		const s = `{"name":"API_KEY","created_at":"2026-12-01T00:00:00Z","bindings":[]}`
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/secrets":
			w.WriteHeader(201)
			_, _ = io.WriteString(w, s)
		case r.Method == "POST":
			_, _ = io.WriteString(w, s)
		case r.Method == "GET" && r.URL.Path == "/v1/secrets":
			_, _ = io.WriteString(w, `{"items":[`+s+`]}`)
		case r.Method == "DELETE":
			problem(w, 409, "secret-in-use", "A sandbox binds it.")
		default:
			problem(w, 404, "secret-not-found", "No such secret.")
		}
	}))
	ctx := context.Background()
	if s, err := c.CreateSecret(ctx, "API_KEY", "v1"); err != nil || s.Name != "API_KEY" {
		t.Fatalf("CreateSecret: %+v, %v", s, err)
	}
	if _, err := c.RotateSecret(ctx, "API_KEY", "v2"); err != nil {
		t.Fatal(err)
	}
	if list, err := c.Secrets(ctx); err != nil || len(list) != 1 {
		t.Fatalf("Secrets: %v, %v", list, err)
	}
	if _, err := c.GetSecret(ctx, "NONE"); !IsCode(err, ErrSecretNotFound) {
		t.Fatalf("GetSecret of none: %v", err)
	}
	if err := c.DeleteSecret(ctx, "API_KEY"); !IsCode(err, ErrSecretInUse) {
		t.Fatalf("DeleteSecret of a bound one: %v", err)
	}
	want := []string{`POST /v1/secrets {"name":"API_KEY","value":"v1"}`, `POST /v1/secrets/API_KEY/rotate {"value":"v2"}`,
		"GET /v1/secrets ", "GET /v1/secrets/NONE ", "DELETE /v1/secrets/API_KEY "}
	for i := range want {
		want[i] = strings.TrimSpace(want[i])
	}
	for i := range seen {
		seen[i] = strings.TrimSpace(seen[i])
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}
