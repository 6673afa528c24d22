package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func postLogin(t *testing.T, s *Server, code string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "http://127.0.0.1/login", strings.NewReader(`{"code":"`+code+`"}`))
	req.Header.Set("Content-Type", "application/json")
	s.ServeHTTP(rec, req)
	return rec
}

// TestLoginIsSingleUse: the code gives the token once; a second use, a wrong code, an expired
// code and a server without a token all answer 401.
func TestLoginIsSingleUse(t *testing.T) {
	t.Parallel()
	const token = "the-server-token-0123456789"
	s, logs := newTestServer(t, Config{Token: token})
	clock := time.Now()
	s.now = func() time.Time { return clock }

	code, err := s.IssueLogin(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code == token || strings.Contains(code, token) {
		t.Fatal("the login code is the token")
	}
	wrong := strings.Repeat("0", len(code))
	if rec := postLogin(t, s, wrong); rec.Code != http.StatusUnauthorized {
		t.Fatalf("a wrong code: %d %s", rec.Code, rec.Body)
	}
	rec := postLogin(t, s, code)
	var out struct{ Token string }
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &out) != nil || out.Token != token {
		t.Fatalf("the code after a wrong guess: %d %s", rec.Code, rec.Body)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("the token's answer may be cached: Cache-Control %q", cc)
	}
	if rec := postLogin(t, s, code); rec.Code != http.StatusUnauthorized || decodeProblem(t, rec).Code != "unauthorized" {
		t.Fatalf("the code used twice: %d %s", rec.Code, rec.Body)
	}

	code, err = s.IssueLogin(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Minute)
	if rec := postLogin(t, s, code); rec.Code != http.StatusUnauthorized {
		t.Fatalf("an expired code: %d %s", rec.Code, rec.Body)
	}
	if strings.Contains(logs.String(), token) {
		t.Fatalf("the token reached the log:\n%s", logs)
	}

	open, _ := newTestServer(t, Config{})
	if _, err := open.IssueLogin(time.Minute); err == nil {
		t.Fatal("a server without a token issued a login")
	}
	if rec := postLogin(t, open, wrong); rec.Code != http.StatusUnauthorized {
		t.Fatalf("login on a server without a token: %d %s", rec.Code, rec.Body)
	}
}
