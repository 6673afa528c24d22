package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
)

// fuzzHandlers answers the operations the fuzz target reaches with a coded error, so that any
// 500 the target sees comes from the server's own decoding and validation.
type fuzzHandlers struct{ openapi.StrictServerInterface }

func (fuzzHandlers) CreateSandbox(context.Context, openapi.CreateSandboxRequestObject) (openapi.CreateSandboxResponseObject, error) {
	return nil, errcode.New(errcode.NotImplemented, "fuzz")
}

func (fuzzHandlers) ExecCommand(context.Context, openapi.ExecCommandRequestObject) (openapi.ExecCommandResponseObject, error) {
	return nil, errcode.New(errcode.NotImplemented, "fuzz")
}

func (fuzzHandlers) CaptureGeneration(context.Context, openapi.CaptureGenerationRequestObject) (openapi.CaptureGenerationResponseObject, error) {
	return nil, errcode.New(errcode.NotImplemented, "fuzz")
}

// FuzzRequestBody sends arbitrary bodies (and query strings) to the JSON operations: whatever
// comes in, the answer is a problem with a known code, never a 500 or a panic, and a body the
// contract accepts reaches the handler.
func FuzzRequestBody(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"id":"a1","start":true}`, `{"id":"A"}`, `{"resources":{"memory_mb":1e99}}`,
		`{"labels":{"k":"v"}}`, `{"env":["A=1","B"]}`, `{"command":["true"],"wait_ms":-1}`,
		`{"command":[]}`, `{"sandbox":"x"}`, `[`, `null`, `"str"`, `{"id":"` + strings.Repeat("a", 70) + `"}`,
	} {
		f.Add(seed, "timeout=1000")
	}
	s, err := New(Config{Handlers: fuzzHandlers{}, Logger: discardLogger()})
	if err != nil {
		f.Fatal(err)
	}
	paths := []string{"/v1/sandboxes", "/v1/sandboxes/a1/exec", "/v1/templates/t1/generations"}
	f.Fuzz(func(t *testing.T, body, query string) {
		for _, p := range paths {
			req := httptest.NewRequest("POST", "http://127.0.0.1"+p, strings.NewReader(body))
			req.URL.RawQuery = query
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if rec.Code >= 500 && rec.Code != http.StatusNotImplemented {
				t.Fatalf("POST %s?%s %q: status %d: %s", p, query, body, rec.Code, rec.Body)
			}
			var pr problem
			if err := json.Unmarshal(rec.Body.Bytes(), &pr); err != nil || pr.Code == "" {
				t.Fatalf("POST %s %q: not a problem: %s", p, body, rec.Body)
			}
			if _, known := statusOf[errcode.Code(pr.Code)]; !known || statusOf[errcode.Code(pr.Code)] != rec.Code {
				t.Fatalf("POST %s %q: code %q with status %d", p, body, pr.Code, rec.Code)
			}
		}
	})
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
