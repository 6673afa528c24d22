package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

// api is a small client of the bothyd endpoints the load uses. It is written against the
// wire (not the generated client) so that what is timed is one HTTP exchange and nothing else.
type api struct {
	base  string
	token string
	http  *http.Client
	ws    *websocket.Dialer
}

// apiError is a failed exchange: the status and problem code, or a transport failure.
type apiError struct {
	Status int
	Code   string
	Detail string
	Err    error
}

func (e *apiError) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Detail)
}

// key is how the report counts this failure.
func (e *apiError) key() string {
	if e.Err != nil {
		if errors.Is(e.Err, context.DeadlineExceeded) {
			return "timeout"
		}
		return "transport"
	}
	if e.Code == "" {
		return strconv.Itoa(e.Status)
	}
	return strconv.Itoa(e.Status) + " " + e.Code
}

// errKey is the report's key for any error.
func errKey(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.key()
	}
	return "other"
}

func newAPI(base, token string, clients int) *api {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Every client keeps its connection: the load measures the server, not TCP handshakes.
	tr.MaxIdleConnsPerHost = max(clients*2, 8)
	tr.MaxIdleConns = tr.MaxIdleConnsPerHost
	return &api{
		base:  strings.TrimRight(base, "/"),
		token: token,
		http:  &http.Client{Transport: tr},
		ws:    &websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 64 << 10},
	}
}

// call sends one request and decodes a 2xx JSON answer into out (when not nil).
func (a *api) call(ctx context.Context, method, path string, in, out any, want int) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return &apiError{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return &apiError{Err: err}
	}
	if resp.StatusCode != want {
		var p struct {
			Code   string `json:"code"`
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(b, &p)
		return &apiError{Status: resp.StatusCode, Code: p.Code, Detail: p.Detail}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decoding %q: %w", method, path, b, err)
		}
	}
	return nil
}

func (a *api) create(ctx context.Context, body map[string]any) error {
	return a.call(ctx, "POST", "/v1/sandboxes", body, nil, http.StatusCreated)
}

// createServerID is create of a body that names no id: it returns the id the server chose.
func (a *api) createServerID(ctx context.Context, body map[string]any) (string, error) {
	var sb struct {
		ID string `json:"id"`
	}
	if err := a.call(ctx, "POST", "/v1/sandboxes", body, &sb, http.StatusCreated); err != nil {
		return "", err
	}
	if sb.ID == "" {
		return "", errors.New("the create's answer names no id")
	}
	return sb.ID, nil
}

func (a *api) start(ctx context.Context, id string) error {
	return a.call(ctx, "POST", "/v1/sandboxes/"+id+"/start", nil, nil, http.StatusOK)
}

func (a *api) stop(ctx context.Context, id string, force bool) error {
	q := ""
	if force {
		q = "?force=true"
	}
	return a.call(ctx, "POST", "/v1/sandboxes/"+id+"/stop"+q, nil, nil, http.StatusOK)
}

func (a *api) remove(ctx context.Context, id string) error {
	return a.call(ctx, "DELETE", "/v1/sandboxes/"+id, nil, nil, http.StatusNoContent)
}

// forceRemove deletes sandbox id, killing it first if it runs.
func (a *api) forceRemove(ctx context.Context, id string) error {
	return a.call(ctx, "DELETE", "/v1/sandboxes/"+id+"?force=true", nil, nil, http.StatusNoContent)
}

// listAll reads the whole sandbox listing, page by page, limit sandboxes a page.
func (a *api) listAll(ctx context.Context, limit int) error {
	cursor := ""
	for {
		var page struct {
			NextCursor *string `json:"next_cursor"`
		}
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		if err := a.call(ctx, "GET", "/v1/sandboxes?"+q.Encode(), nil, &page, http.StatusOK); err != nil {
			return err
		}
		if page.NextCursor == nil {
			return nil
		}
		cursor = *page.NextCursor
	}
}

// listPage reads the first page of the sandbox listing.
func (a *api) listPage(ctx context.Context, limit int) error {
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	return a.call(ctx, "GET", "/v1/sandboxes?"+q.Encode(), nil, nil, http.StatusOK)
}

// execResult is the part of a buffered exec's answer the load checks.
type execResult struct {
	ExitCode int     `json:"exit_code"`
	Signal   *string `json:"signal"`
	TimedOut bool    `json:"timed_out"`
	Stdout   string  `json:"stdout"`
	Stderr   string  `json:"stderr"`
}

// exec runs argv buffered and fails unless it exits 0.
func (a *api) exec(ctx context.Context, id string, argv []string, user string, waitMS int) (execResult, error) {
	body := map[string]any{"command": argv}
	if user != "" {
		body["user"] = user
	}
	if waitMS > 0 {
		body["wait_ms"] = waitMS
	}
	var res execResult
	if err := a.call(ctx, "POST", "/v1/sandboxes/"+id+"/exec", body, &res, http.StatusOK); err != nil {
		return res, err
	}
	if res.ExitCode != 0 || res.Signal != nil || res.TimedOut {
		return res, fmt.Errorf("%v exited %d (signal %v, timed out %v): %s", argv, res.ExitCode, res.Signal, res.TimedOut, res.Stderr)
	}
	return res, nil
}

// stream runs argv over the exec websocket and returns how many stdout bytes arrived; it
// fails unless the workload exits 0 and the socket closes normally.
func (a *api) stream(ctx context.Context, id string, argv []string, waitMS int) (int64, error) {
	q := url.Values{"command": argv}
	if waitMS > 0 {
		q.Set("wait_ms", strconv.Itoa(waitMS))
	}
	u := "ws" + strings.TrimPrefix(a.base, "http") + "/v1/sandboxes/" + id + "/exec/stream?" + q.Encode()
	h := http.Header{}
	if a.token != "" {
		h.Set("Authorization", "Bearer "+a.token)
	}
	conn, resp, err := a.ws.DialContext(ctx, u, h)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			var p struct {
				Code   string `json:"code"`
				Detail string `json:"detail"`
			}
			b, _ := io.ReadAll(resp.Body)
			_ = json.Unmarshal(b, &p)
			return 0, &apiError{Status: resp.StatusCode, Code: p.Code, Detail: p.Detail}
		}
		return 0, &apiError{Err: err}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	var n int64
	var exit *struct {
		ExitCode int     `json:"exit_code"`
		Signal   *string `json:"signal"`
	}
	var first [1]byte
	for {
		kind, r, err := conn.NextReader()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) && exit != nil {
				break
			}
			return n, &apiError{Err: err}
		}
		switch kind {
		case websocket.BinaryMessage:
			if _, err := io.ReadFull(r, first[:]); err != nil {
				return n, &apiError{Err: err}
			}
			m, err := io.Copy(io.Discard, r)
			if err != nil {
				return n, &apiError{Err: err}
			}
			if first[0] == 1 {
				n += m
			}
		case websocket.TextMessage:
			b, err := io.ReadAll(r)
			if err != nil {
				return n, &apiError{Err: err}
			}
			if err := json.Unmarshal(b, &exit); err != nil {
				return n, fmt.Errorf("control message %q: %w", b, err)
			}
		}
	}
	if exit.ExitCode != 0 || exit.Signal != nil {
		return n, fmt.Errorf("%v exited %d (signal %v)", argv, exit.ExitCode, exit.Signal)
	}
	return n, nil
}

// probeWait bounds how long bothyload waits for the server's runtime probes.
const probeWait = 3 * time.Minute

// waitForProbes waits until no runtime of the server is still probing (/v1/info), saying so
// on log once if it has to wait. A probe boots a guest (the microvm runtime's, seconds of
// both CPUs under emulation) right after bothyd starts, and figures taken beside it measure
// the probe as much as the server.
func (a *api) waitForProbes(ctx context.Context, log io.Writer) error {
	deadline := time.Now().Add(probeWait)
	said := false
	for {
		var info struct {
			Runtimes []struct {
				Kind  string `json:"kind"`
				State string `json:"state"`
			} `json:"runtimes"`
		}
		if err := a.call(ctx, "GET", "/v1/info", nil, &info, http.StatusOK); err != nil {
			return err
		}
		var probing []string
		for _, rt := range info.Runtimes {
			if rt.State == "probing" {
				probing = append(probing, rt.Kind)
			}
		}
		if len(probing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s runtime is still probing after %v", strings.Join(probing, " and "), probeWait)
		}
		if !said {
			fmt.Fprintf(log, "waiting for the server's %s runtime probe to finish: it would share the CPUs with the figures\n", strings.Join(probing, " and "))
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
