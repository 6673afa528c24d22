package handlers

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// umaskOf is a workload's umask for a table: -1 for none (the agent's default).
func umaskOf(req supervisor.ExecRequest) int {
	if req.Umask == nil {
		return -1
	}
	return int(*req.Umask)
}

// TestExecUmask: the umask of a buffered exec and of a stream reaches the workload as a
// mask, octal as written; what is not three octal digits (after an optional 0) is refused
// before anything is admitted.
func TestExecUmask(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		field string // the JSON value in a buffered exec; "" for none
		query string // the query value of a stream; "" for none
		want  int    // -1: none; -2: refused as invalid-request
	}{
		{"absent", "", "", -1},
		{"four digits", `"0077"`, "0077", 0o077},
		{"three digits", `"027"`, "027", 0o027},
		{"zero", `"0000"`, "000", 0},
		{"everything", `"0777"`, "777", 0o777},
		{"two digits", `"77"`, "77", -2},
		{"not octal", `"0080"`, "0080", -2},
		{"too long", `"00777"`, "00777", -2},
		{"a number", `63`, "", -2},
		{"negative", `"-022"`, "-022", -2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeSupervisor{runResult: &supervisor.ExecResult{}}
			h, _ := newTestHandlers(t, f)
			body := `{"command":["true"]}`
			if tc.field != "" {
				body = `{"command":["true"],"umask":` + tc.field + `}`
			}
			code, out := do(t, newTestServer(t, h), "POST", "/v1/sandboxes/a1/exec", body)
			if tc.want == -2 {
				if p := problemOf(t, out); code != http.StatusBadRequest || p.Code != string(errcode.InvalidRequest) || len(f.admitted) != 0 {
					t.Errorf("buffered %s: %d %+v, %d admitted; want 400 invalid-request, none admitted", tc.field, code, p, len(f.admitted))
				}
			} else if code != http.StatusOK || len(f.runs) != 1 || umaskOf(f.runs[0].req) != tc.want {
				t.Errorf("buffered %s: %d %s; want umask %o", tc.field, code, out, tc.want)
			}

			if tc.field == `63` {
				return // a query has no numbers apart from strings
			}
			fs, s, _ := streamServer(t)
			q := "command=sh"
			if tc.query != "" {
				q += "&umask=" + tc.query
			}
			code, out = do(t, s, "GET", "/v1/sandboxes/a/exec/stream?"+q, "", upgrade...)
			p := problemOf(t, out)
			switch {
			case tc.want == -2:
				if code != http.StatusBadRequest || p.Code != string(errcode.InvalidRequest) || len(fs.admitted) != 0 {
					t.Errorf("stream %s: %d %+v; want 400 invalid-request, none admitted", tc.query, code, p)
				}
			case len(fs.execs) != 1 || umaskOf(fs.execs[0]) != tc.want:
				t.Errorf("stream %s: %d %+v, workloads %+v; want umask %o", tc.query, code, p, fs.execs, tc.want)
			}
		})
	}
}

// TestStreamUmaskUnvalidated: without the server's validation in front, a umask that is not
// octal is still refused, on its parameter, and nothing is admitted.
func TestStreamUmaskUnvalidated(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{}
	h, _ := newTestHandlers(t, f)
	var got error
	r := chi.NewRouter()
	r.Get("/v1/sandboxes/{id}/exec/stream", func(w http.ResponseWriter, r *http.Request) { got = h.ExecStream(w, r) })
	req := httptest.NewRequest("GET", "/v1/sandboxes/a/exec/stream?command=sh&umask=9999", nil)
	for i := 0; i < len(upgrade); i += 2 {
		req.Header.Set(upgrade[i], upgrade[i+1])
	}
	r.ServeHTTP(httptest.NewRecorder(), req)
	var e *errcode.Error
	if !errors.As(got, &e) || e.Code != errcode.InvalidRequest || e.Field != "umask" {
		t.Errorf("umask=9999: %v, want invalid-request on umask", got)
	}
	if len(f.admitted) != 0 {
		t.Error("refused, but admitted")
	}
}
