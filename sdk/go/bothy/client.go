package bothy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/openapi/client"
)

// The API's types, as the contract defines them.
type (
	Sandbox      = client.Sandbox
	SandboxState = client.SandboxState
	Resources    = client.Resources
	Labels       = client.Labels
	LastExit     = client.LastExit
	ExecResult   = client.ExecResult
	FileEntry    = client.FileEntry
	Template     = client.Template
	Generation   = client.Generation
	// GenerationSource is what a generation was captured from: its lineage.
	GenerationSource = client.GenerationSource
	Lease            = client.Lease
	Info             = client.Info
	Event            = client.Event
	Problem          = client.Problem
	// SandboxMetrics is a sandbox's usage now and the server's recent samples of it.
	SandboxMetrics = client.SandboxMetrics
	UsageSample    = client.UsageSample
)

// DefaultURL is where bothyd listens unless told otherwise.
const DefaultURL = "http://127.0.0.1:7780"

// Client talks to one bothyd. The zero value is not usable; make one with [New].
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
	// userAgent is sent with every request, so that a server's access log can tell clients
	// apart.
	userAgent string
}

// Option configures a [Client].
type Option func(*Client)

// WithToken sends token as the bearer token of every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient makes requests with hc instead of a default client. Its Timeout, if any,
// bounds every request, exec streams and the event stream included; prefer a context.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithUserAgent names the client in the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// New returns a client of the bothyd at baseURL (scheme://host:port, optionally with a
// path prefix; "" is [DefaultURL]).
func New(baseURL string, opts ...Option) (*Client, error) {
	if baseURL == "" {
		baseURL = DefaultURL
	}
	u, err := url.Parse(strings.TrimSuffix(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("bothyd: the URL %q does not parse: %w", baseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("bothyd: the URL %q needs http:// or https://", baseURL)
	}
	c := &Client{base: u, http: &http.Client{}, userAgent: "bothyd-go"}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// URL is the server's base URL.
func (c *Client) URL() string { return c.base.String() }

// request is one API call.
type request struct {
	method string
	path   string
	query  url.Values
	header http.Header
	body   io.Reader
	// ctype is the body's content type; a JSON body sets it itself.
	ctype string
}

func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	return u.String()
}

// send makes the request and returns the response whatever its status; the caller closes
// its body. A transport failure is an [*UnreachableError] when nothing answered.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, r.method, c.url(r.path, r.query), r.body)
	if err != nil {
		return nil, err
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if r.ctype != "" {
		req.Header.Set("Content-Type", r.ctype)
	}
	c.authorize(req.Header)
	if key, ok := ctx.Value(idempotencyKey{}).(string); ok && r.method == http.MethodPost {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(err)
	}
	return resp, nil
}

func (c *Client) authorize(h http.Header) {
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" {
		h.Set("User-Agent", c.userAgent)
	}
}

// call makes the request, turns an answer outside ok into an [*APIError], and decodes a JSON
// answer into out (when out is not nil).
func (c *Client) call(ctx context.Context, r request, out any, ok ...int) (int, error) {
	resp, err := c.send(ctx, r)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if !statusIn(resp.StatusCode, ok) {
		return resp.StatusCode, readProblem(resp)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.StatusCode, fmt.Errorf("bothyd: the answer to %s %s does not decode: %w", r.method, r.path, err)
	}
	return resp.StatusCode, nil
}

func statusIn(status int, ok []int) bool {
	if len(ok) == 0 {
		return status >= 200 && status < 300
	}
	for _, s := range ok {
		if s == status {
			return true
		}
	}
	return false
}

func jsonBody(v any) (io.Reader, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return bytes.NewReader(b), nil
}

// post is a POST with a JSON body (nil for none).
func (c *Client) post(ctx context.Context, path string, q url.Values, in, out any) error {
	r := request{method: http.MethodPost, path: path, query: q}
	if in != nil {
		body, err := jsonBody(in)
		if err != nil {
			return err
		}
		r.body, r.ctype = body, "application/json"
	}
	_, err := c.call(ctx, r, out)
	return err
}

func (c *Client) get(ctx context.Context, path string, q url.Values, out any) error {
	_, err := c.call(ctx, request{method: http.MethodGet, path: path, query: q}, out)
	return err
}

func sandboxPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// timeoutQuery is the `timeout` of a transition, or none.
func timeoutQuery(d time.Duration) url.Values {
	q := url.Values{}
	if d > 0 {
		q.Set("timeout", millis(d))
	}
	return q
}

// CreateOptions is what a new sandbox is made of; the zero value is a sandbox of the host
// image with the server's default resources and a generated id.
type CreateOptions struct {
	ID    string `json:"id,omitempty"`
	Image string `json:"image,omitempty"`
	// Template clones the sandbox from a generation of this template: Generation, or the
	// newest eligible one.
	Template   string            `json:"template,omitempty"`
	Generation string            `json:"generation,omitempty"`
	Resources  *ResourcesRequest `json:"resources,omitempty"`
	Env        []string          `json:"env,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Start starts the sandbox before the answer.
	Start bool `json:"start,omitempty"`
	// TimeoutS is the sandbox's lifetime in seconds (0: the server's default); a server older
	// than lifetimes refuses it as an unknown field.
	TimeoutS int `json:"timeout_s,omitempty"`
	// OnTimeout is what the lifetime's end does: "stop" (the default) or "delete".
	OnTimeout string `json:"on_timeout,omitempty"`
	// Sleep lets the sandbox sleep (pause) when idle and wake on use; a server older than
	// sleep and wake refuses it as an unknown field.
	Sleep *SleepOptions `json:"sleep,omitempty"`
	// Volumes are volumes to mount ([Client.CreateVolume] makes them); a server older than
	// volumes refuses them as an unknown field.
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// SleepOptions is a sandbox's sleep policy: it pauses once unused for IdleTimeoutS seconds,
// and the next request that needs it wakes it unless NoAutoResume.
type SleepOptions struct {
	IdleTimeoutS int `json:"idle_timeout_seconds"`
	// NoAutoResume leaves a sleeping sandbox paused until a resume.
	NoAutoResume bool `json:"-"`
	// IgnoreWork lets it sleep while work inside uses the CPU.
	IgnoreWork bool `json:"idle_ignores_work,omitempty"`
}

// MarshalJSON sends auto_resume only when it is turned off (the server's default is on).
func (s SleepOptions) MarshalJSON() ([]byte, error) {
	type plain SleepOptions
	v := struct {
		plain
		AutoResume *bool `json:"auto_resume,omitempty"`
	}{plain: plain(s)}
	if s.NoAutoResume {
		off := false
		v.AutoResume = &off
	}
	return json.Marshal(v)
}

// ResourcesRequest asks for resource limits; a zero field is the server's default.
type ResourcesRequest struct {
	Vcpus    int `json:"vcpus,omitempty"`
	MemoryMb int `json:"memory_mb,omitempty"`
	Pids     int `json:"pids,omitempty"`
	DiskMb   int `json:"disk_mb,omitempty"`
}

// Create provisions a sandbox (and starts it when o.Start).
func (c *Client) Create(ctx context.Context, o CreateOptions) (*Sandbox, error) {
	var sb Sandbox
	if err := c.post(ctx, "/v1/sandboxes", nil, o, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Get reads a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.get(ctx, sandboxPath(id), nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filters a listing; every label ("k=v") must match.
type ListOptions struct {
	State  SandboxState
	Labels []string
}

// List returns every sandbox that matches o, following the pages to the end.
func (c *Client) List(ctx context.Context, o ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	if o.State != "" {
		q.Set("state", string(o.State))
	}
	for _, l := range o.Labels {
		q.Add("label", l)
	}
	return listAll[Sandbox](ctx, c, "/v1/sandboxes", q)
}

// listAll follows next_cursor until the last page.
func listAll[T any](ctx context.Context, c *Client, path string, q url.Values) ([]T, error) {
	var all []T
	for {
		var page struct {
			Items      []T     `json:"items"`
			NextCursor *string `json:"next_cursor"`
		}
		if err := c.get(ctx, path, q, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Items...)
		if page.NextCursor == nil || *page.NextCursor == "" {
			return all, nil
		}
		q.Set("cursor", *page.NextCursor)
	}
}

// Start launches a provisioned or stopped sandbox and waits until its agent answers;
// timeout bounds the wait for other transitions (0: the server's default).
func (c *Client) Start(ctx context.Context, id string, timeout time.Duration) (*Sandbox, error) {
	var sb Sandbox
	if err := c.post(ctx, sandboxPath(id, "/start"), timeoutQuery(timeout), nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Stop asks the sandbox to shut down (or kills it, with force) and waits for it to end.
func (c *Client) Stop(ctx context.Context, id string, force bool, timeout time.Duration) (*Sandbox, error) {
	q := timeoutQuery(timeout)
	if force {
		q.Set("force", "true")
	}
	var sb Sandbox
	if err := c.post(ctx, sandboxPath(id, "/stop"), q, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Delete deprovisions a stopped sandbox. With force, a running one is killed first: by the
// server in the same transition when it knows forced deletes, else (an older server ignores
// `force` and answers sandbox-launched) by a forced stop before a second delete.
func (c *Client) Delete(ctx context.Context, id string, force bool) error {
	q := url.Values{}
	if force {
		q.Set("force", "true")
	}
	_, err := c.call(ctx, request{method: http.MethodDelete, path: sandboxPath(id), query: q}, nil)
	if err == nil || !force || !IsCode(err, ErrSandboxLaunched) {
		return err
	}
	if _, err := c.Stop(ctx, id, true, 0); err != nil && !IsCode(err, ErrNotRunning) {
		return err
	}
	_, err = c.call(ctx, request{method: http.MethodDelete, path: sandboxPath(id)}, nil)
	return err
}

// Pause freezes every process of a running sandbox.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.post(ctx, sandboxPath(id, "/pause"), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// PauseReleasingMemory pauses a running microVM and releases its memory: saved to the
// sandbox's state directory, its QEMU ended. Resume restores it, within the restore window.
func (c *Client) PauseReleasingMemory(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.post(ctx, sandboxPath(id, "/pause"), nil, map[string]string{"memory": "release"}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Metrics reads what a running sandbox uses now, with the server's recent samples of it.
func (c *Client) Metrics(ctx context.Context, id string) (*SandboxMetrics, error) {
	var m SandboxMetrics
	if err := c.get(ctx, sandboxPath(id, "/metrics"), nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.post(ctx, sandboxPath(id, "/resume"), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// SetTimeout sets the sandbox's lifetime to d from now (0 clears it); onTimeout is "stop",
// "delete" or "" for the server's default.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration, onTimeout string) (*Sandbox, error) {
	body := struct {
		TimeoutS  int64  `json:"timeout_s"`
		OnTimeout string `json:"on_timeout,omitempty"`
	}{int64(d / time.Second), onTimeout}
	var sb Sandbox
	if err := c.post(ctx, sandboxPath(id, "/timeout"), nil, body, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Logs returns the sandbox's console log, the last tail lines when tail > 0.
func (c *Client) Logs(ctx context.Context, id string, tail int) (io.ReadCloser, error) {
	q := url.Values{}
	if tail > 0 {
		q.Set("tail", strconv.Itoa(tail))
	}
	return c.stream(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/logs"), query: q})
}

// stream makes a request whose successful answer the caller reads as it arrives.
func (c *Client) stream(ctx context.Context, r request) (io.ReadCloser, error) {
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, readProblem(resp)
	}
	return resp.Body, nil
}

// Info is what the server runs and accepts.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var info Info
	if err := c.get(ctx, "/v1/info", nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Health reports whether the server answers /healthz, which needs no token.
func (c *Client) Health(ctx context.Context) error {
	return c.get(ctx, "/healthz", nil, nil)
}
