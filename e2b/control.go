package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/supervisor"
)

// sandboxID is the form of the ids E2B's SDKs accept; a sandbox of bothyd whose id does not
// have it (one with a '-') is invisible to E2B's list.
var sandboxID = regexp.MustCompile(`^[a-z0-9]+$`)

// The template name that means bothyd's default image, as E2B's default template.
const baseTemplate = "base"

// clientID is what E2B calls the cluster node that runs a sandbox; bothyd is one node.
const clientID = "bothyd"

// apiError is E2B's error body; its SDKs read code rather than the status.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, apiError{Code: status, Message: fmt.Sprintf(format, args...)})
}

// statusOf is the HTTP status of a supervisor error, by its code; unknown errors are 500s.
//
// The refusals of a sandbox's files are answered as envd answers the same case, which is not
// always bothyd's own status: envd's 400 (the SDKs' InvalidArgumentError) for a directory
// read or written as a file, a listing of a file, a path in the way of a directory, a name
// too long; its failed_precondition (409 here) for a symbolic-link loop. envd acts as root,
// so it has no answer of its own for a path the user may not access: that is 403
// (permission_denied), which the SDKs raise as a SandboxError naming the status, as they do
// envd's 500 for a failed open.
func statusOf(err error) int {
	switch errcode.Of(err) {
	case errcode.InvalidRequest, errcode.NotADirectory, errcode.IsADirectory,
		errcode.NotARegularFile, errcode.DirectoryNotEmpty, errcode.FileExists, errcode.NameTooLong:
		return http.StatusBadRequest
	case errcode.PermissionDenied:
		return http.StatusForbidden
	case errcode.SymlinkLoop, errcode.MountInside, errcode.FileChanged:
		return http.StatusConflict
	case errcode.SandboxNotFound, errcode.TemplateNotFound, errcode.GenerationNotFound,
		errcode.FileNotFound, errcode.ImageNotFound, errcode.VolumeNotFound, errcode.CheckpointNotFound,
		errcode.SecretNotFound:
		return http.StatusNotFound
	case errcode.SecretExists, errcode.SecretInUse:
		return http.StatusConflict
	case errcode.AlreadyProvisioned, errcode.ProvisionedAgain, errcode.AlreadyRunning,
		errcode.NotRunning, errcode.SandboxLaunched, errcode.SandboxPaused, errcode.TemplateIneligible,
		errcode.TemplateTombstoned, errcode.RuntimeMismatch, errcode.ForeignFiles, errcode.VolumeExists,
		errcode.TemplateExists, errcode.CheckpointExists, errcode.CheckpointLimit:
		return http.StatusConflict
	case errcode.SandboxBusy, errcode.TransitionInProgress, errcode.SandboxLeased, errcode.VolumeInUse:
		return http.StatusLocked
	case errcode.LimitReached, errcode.PidsLimit:
		return http.StatusTooManyRequests
	case errcode.StartTimeout, errcode.StopTimeout:
		return http.StatusGatewayTimeout
	case errcode.StorageFull, errcode.VolumeFull:
		return http.StatusInsufficientStorage
	case errcode.Unavailable, errcode.StorageUnavailable, errcode.SandboxWaking, errcode.NodeFull, errcode.NodeDraining,
		errcode.RegistryUnavailable, errcode.RegistryRefused:
		return http.StatusServiceUnavailable
	case errcode.NotImplemented, errcode.CheckpointUnsupported:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// fail answers err in E2B's form. An error without a code is answered without its text, as
// bothyd's own server does, and logged.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		h.log.Error("e2b: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "The server failed to handle the request; see its log."
	}
	if c := errcode.Of(err); c == errcode.NodeFull || c == errcode.NodeDraining {
		// A cluster's router reads the code here to place the create on another node: E2B's
		// error body has no field for it.
		w.Header().Set(CodeHeader, string(c))
		w.Header().Set("Retry-After", "5")
	}
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// CodeHeader carries the bothy code of a refusal that E2B's error body cannot say: a node's
// node-full or node-draining, for the cluster's router.
const CodeHeader = "Bothy-Error-Code"

// serveControl authenticates a control-plane call and routes it.
func (h *Handler) serveControl(w http.ResponseWriter, r *http.Request) {
	if !h.apiKeyOK(r.Header.Get("X-API-KEY")) {
		writeError(w, http.StatusUnauthorized, "Invalid API key: set E2B_API_KEY to bothyd's token, optionally behind the prefix e2b_ (see docs/e2b.md).")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxJSONBytes)
	controlMux(h).ServeHTTP(w, r)
}

// controlMux is the control plane's route table.
func controlMux(h *Handler) *http.ServeMux {
	m := http.NewServeMux()
	for _, prefix := range []string{"", "/v2"} {
		m.HandleFunc("POST "+prefix+"/sandboxes", h.create)
		m.HandleFunc("GET "+prefix+"/sandboxes", h.list)
		m.HandleFunc("POST "+prefix+"/sandboxes/{id}/connect", h.connect)
		m.HandleFunc("GET "+prefix+"/sandboxes/{id}", h.detail)
	}
	m.HandleFunc("DELETE /sandboxes/{id}", h.kill)
	m.HandleFunc("POST /sandboxes/{id}/timeout", h.setTimeout)
	m.HandleFunc("POST /sandboxes/{id}/refreshes", h.refresh)
	m.HandleFunc("POST /sandboxes/{id}/pause", h.pause)
	m.HandleFunc("POST /sandboxes/{id}/resume", h.connect)
	m.HandleFunc("GET /sandboxes/{id}/metrics", h.metrics)
	m.HandleFunc("GET /sandboxes/metrics", h.sandboxesMetrics)
	m.HandleFunc("POST /volumes", h.createVolume)
	m.HandleFunc("GET /volumes", h.listVolumes)
	m.HandleFunc("GET /volumes/{volumeID}", h.getVolume)
	m.HandleFunc("DELETE /volumes/{volumeID}", h.deleteVolume)
	m.HandleFunc("POST /sandboxes/{id}/fork", h.fork)
	m.HandleFunc("POST /sandboxes/{id}/snapshots", h.createSnapshot)
	m.HandleFunc("GET /snapshots", h.listSnapshots)
	m.HandleFunc("DELETE /templates/{id}", h.deleteTemplate)
	m.HandleFunc("GET /secrets", h.listSecrets)
	m.HandleFunc("POST /secrets", h.createSecret)
	m.HandleFunc("GET /secrets/{id}", h.getSecret)
	m.HandleFunc("POST /secrets/{id}", h.updateSecret)
	m.HandleFunc("DELETE /secrets/{id}", h.deleteSecret)
	// 501, not 404: the SDKs read a 404 as "no such sandbox" (getMetrics threw
	// SandboxNotFoundError before bothyd served it), which would misname what is missing.
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, "bothyd does not implement %s %s of E2B's API (see docs/e2b.md).", r.Method, r.URL.Path)
	})
	return m
}

// createBody is E2B's NewSandbox, of which bothyd reads what it can honour.
type createBody struct {
	TemplateID string `json:"templateID"`
	Timeout    *int   `json:"timeout"`
	AutoPause  *bool  `json:"autoPause"`
	// AutoResume is E2B's {enabled}: with autoPause, traffic wakes the paused sandbox.
	AutoResume *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	Metadata map[string]string `json:"metadata"`
	EnvVars  map[string]string `json:"envVars"`
	// AllowInternetAccess is E2B's switch for the internet (the SDKs send it only when the
	// caller set it); Network its egress rules.
	AllowInternetAccess *bool        `json:"allow_internet_access"`
	Network             *networkBody `json:"network"`
	// VolumeMounts are E2B's SandboxVolumeMount: a volume by name (its id) at a path.
	VolumeMounts []struct {
		Name string `json:"name"`
		Path string `json:"path"`
	} `json:"volumeMounts"`
}

// networkBody is the part of E2B's SandboxNetworkConfig that bothyd's egress policy can say.
type networkBody struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// Rules are per-host transforms; those that set a header from a secret are bindings of
	// the policy (secrets.go).
	Rules map[string][]networkRule `json:"rules"`
}

// allTraffic is how E2B's rules name every destination (the SDKs' ALL_TRAFFIC).
const allTraffic = "0.0.0.0/0"

// networkPolicy maps E2B's internet switch and egress rules onto bothyd's policy, or nil
// (no interface but loopback) when the caller asked for neither, or for nothing reachable: bothyd's default, where
// E2B's is the internet (docs/e2b.md says so). In E2B an allowOut entry wins over denyOut, so
// with every destination denied (allow_internet_access false, or 0.0.0.0/0 in denyOut) the
// allowOut entries are the only destinations, which is bothyd's allow-list; with the
// internet open, denyOut entries are bothyd's deny list, and an allowOut entry is an
// exception that bothyd (whose deny wins) cannot say, so it is refused rather than lost.
func networkPolicy(internet *bool, n *networkBody) (*supervisor.NetworkPolicy, error) {
	p, err := egressPolicy(internet, n)
	if err != nil || n == nil || len(n.Rules) == 0 {
		return p, err
	}
	bindings, err := bindingsOf(n.Rules)
	if err != nil || len(bindings) == 0 {
		return p, err
	}
	if p == nil {
		// As in E2B, a rule grants no access: the host must be in allowOut.
		return nil, errcode.Invalid("network.rules", "The rules bind secrets to hosts, and the network reaches nothing; allow the hosts in allowOut.")
	}
	p.Secrets = bindings
	return p, nil
}

// egressPolicy is networkPolicy's allowOut and denyOut.
func egressPolicy(internet *bool, n *networkBody) (*supervisor.NetworkPolicy, error) {
	if internet == nil && (n == nil || len(n.AllowOut)+len(n.DenyOut) == 0) {
		return nil, nil
	}
	var allow, deny []string
	if n != nil {
		allow, deny = n.AllowOut, n.DenyOut
	}
	denyAll := internet != nil && !*internet
	var rest []string
	for _, d := range deny {
		if d == allTraffic {
			denyAll = true
		} else {
			rest = append(rest, d)
		}
	}
	switch {
	case denyAll && len(allow) == 0:
		return nil, nil // nothing reachable: no interface at all
	case denyAll:
		return &supervisor.NetworkPolicy{Internet: false, Allow: allow}, nil
	}
	if len(allow) > 0 && len(rest) > 0 {
		return nil, errcode.Invalid("network", "bothyd cannot open allowOut exceptions in denyOut rules while the internet is open (its deny list wins over its allow list): deny %s to allow only allowOut, or leave allowOut out.", allTraffic)
	}
	return &supervisor.NetworkPolicy{Internet: true, Deny: rest}, nil
}

// created is E2B's Sandbox: what create and connect answer.
type created struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
}

// detail is E2B's SandboxDetail and ListedSandbox.
type detailBody struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	Lifecycle       *lifecycle        `json:"lifecycle,omitempty"`
	VolumeMounts    []volumeMountBody `json:"volumeMounts,omitempty"`
}

// volumeMountBody is E2B's SandboxVolumeMount.
type volumeMountBody struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// lifecycle is E2B's SandboxLifecycle: what the end of the lifetime does ("kill": delete;
// "pause": stop, which connect undoes). bothyd resumes no sandbox on traffic alone.
type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// createRequest maps E2B's create onto the supervisor's: a template or an image, labels from
// metadata, the env, a lifetime from timeout (E2B kills a sandbox at its end: delete; with
// autoPause it keeps it: stop, and connect starts it again).
func (h *Handler) createRequest(b createBody) (supervisor.CreateRequest, error) {
	req := supervisor.CreateRequest{
		ID:        newID(),
		Resources: h.cfg.Resources,
		DiskMB:    h.cfg.DiskMB,
		Env:       b.EnvVars,
		Start:     true,
	}
	// Metadata becomes bothyd's labels, held to the rules of bothyd's own create.
	if err := naming.CheckLabels(b.Metadata); err != nil {
		return req, errcode.Invalid("metadata", "The metadata cannot be bothyd's labels: %v.", err)
	}
	req.Labels = b.Metadata
	if err := naming.CheckEnv(b.EnvVars); err != nil {
		return req, errcode.Invalid("envVars", "The envVars are not valid: %v.", err)
	}
	policy, err := networkPolicy(b.AllowInternetAccess, b.Network)
	if err != nil {
		return req, err
	}
	req.Network = policy
	lt := &supervisor.Lifetime{Timeout: defaultTimeout, OnTimeout: supervisor.TimeoutDelete}
	if b.Timeout != nil && *b.Timeout > 0 {
		lt.Timeout = time.Duration(*b.Timeout) * time.Second
	}
	if b.AutoPause != nil && *b.AutoPause {
		lt.OnTimeout = supervisor.TimeoutStop
	}
	req.Lifetime = lt
	if b.AutoPause != nil && *b.AutoPause && b.AutoResume != nil && b.AutoResume.Enabled {
		// autoPause with autoResume: bothyd's sleep and wake. E2B pauses at the end of the
		// timeout and the next traffic resumes it; bothyd pauses after the timeout without a
		// use (each use restarts it, as E2B's resume restarts the timeout), whatever runs
		// inside, and any request wakes it. No lifetime ends it meanwhile.
		req.Sleep = &supervisor.SleepPolicy{IdleTimeoutS: int(lt.Timeout / time.Second), AutoResume: true, IgnoreWork: true}
		req.Lifetime = nil
	}
	req.Volumes = volumeMounts(b.VolumeMounts)
	switch name := b.TemplateID; {
	case name == "" || name == baseTemplate:
		// bothyd's default image.
	case h.isTemplate(name):
		req.Clone = &supervisor.CloneRequest{Template: name}
	default:
		req.Image = name
	}
	return req, nil
}

// isTemplate reports whether name is one of bothyd's templates; anything else is taken
// for an image, whose absence the create reports.
func (h *Handler) isTemplate(name string) bool {
	_, err := h.sup.Template(name)
	return err == nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	var b createBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		writeError(w, http.StatusBadRequest, "The request body is not a valid JSON sandbox: %v.", err)
		return
	}
	req, err := h.createRequest(b)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	st, err := h.sup.Create(ctx, req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.created(st))
}

func (h *Handler) created(st *supervisor.Status) created {
	return created{
		SandboxID:       st.Config.ID,
		TemplateID:      templateOf(st),
		ClientID:        clientID,
		EnvdVersion:     EnvdVersion,
		EnvdAccessToken: h.accessToken(st.Config.ID),
	}
}

// templateOf is the E2B template a sandbox came from: its template, or its image.
func templateOf(st *supervisor.Status) string {
	if t := st.Config.Template; t != nil {
		return t.Template
	}
	if st.Config.Image == "" || st.Config.Image == supervisor.HostImage {
		return baseTemplate
	}
	return st.Config.Image
}

// stateOf is E2B's view of a sandbox's state: running, or paused for every sandbox that
// connect can bring back (paused, stopped, never started).
func stateOf(s supervisor.State) string {
	switch s {
	case supervisor.StateRunning, supervisor.StateStarting:
		return "running"
	}
	return "paused"
}

func (h *Handler) detailOf(st *supervisor.Status) detailBody {
	d := detailBody{
		SandboxID:   st.Config.ID,
		TemplateID:  templateOf(st),
		ClientID:    clientID,
		StartedAt:   st.Config.CreatedAt,
		CPUCount:    st.Config.Resources.VCPUs,
		MemoryMB:    st.Config.Resources.MemoryMB,
		DiskSizeMB:  st.Config.DiskMB,
		Metadata:    st.Config.Labels,
		State:       stateOf(st.State),
		EnvdVersion: EnvdVersion,
	}
	if st.StartedAt != nil {
		d.StartedAt = *st.StartedAt
	}
	for _, m := range st.Config.Volumes {
		d.VolumeMounts = append(d.VolumeMounts, volumeMountBody{Name: m.Name, Path: m.Path})
	}
	// A sandbox without a lifetime has no end; E2B's schema wants one, and its start is the
	// one time that is certainly not in the future.
	d.EndAt = d.StartedAt
	if st.ExpiresAt != nil {
		d.EndAt = *st.ExpiresAt
		d.Lifecycle = &lifecycle{OnTimeout: "pause"}
		if st.OnTimeout == supervisor.TimeoutDelete {
			d.Lifecycle.OnTimeout = "kill"
		}
	}
	if p := st.Config.Sleep; p != nil {
		d.Lifecycle = &lifecycle{OnTimeout: "pause", AutoResume: p.AutoResume}
		if st.StartedAt != nil {
			d.EndAt = st.StartedAt.Add(time.Duration(p.IdleTimeoutS) * time.Second)
		}
	}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	return d
}

// status reads the sandbox the path names, answering the failure itself.
func (h *Handler) status(w http.ResponseWriter, r *http.Request) (*supervisor.Status, bool) {
	id := r.PathValue("id")
	if !sandboxID.MatchString(id) {
		writeError(w, http.StatusNotFound, "There is no sandbox %q: E2B's sandbox ids are a-z and 0-9 alone.", id)
		return nil, false
	}
	st, err := h.sup.Status(id)
	if err != nil {
		h.fail(w, r, err)
		return nil, false
	}
	return st, true
}

func (h *Handler) detail(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	d := h.detailOf(st)
	d.EnvdAccessToken = h.accessToken(st.Config.ID)
	writeJSON(w, http.StatusOK, d)
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	if err := h.sup.Delete(ctx, st.Config.ID, true); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is E2B's timeout and refresh body, in seconds.
type timeoutBody struct {
	Timeout  *int `json:"timeout"`
	Duration *int `json:"duration"`
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) { h.lifetime(w, r, false) }
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request)    { h.lifetime(w, r, true) }

// lifetime sets a sandbox's lifetime from now, keeping what its end does.
func (h *Handler) lifetime(w http.ResponseWriter, r *http.Request, refresh bool) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	var b timeoutBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil && !(refresh && errors.Is(err, io.EOF)) {
		writeError(w, http.StatusBadRequest, "The request body is not valid JSON: %v.", err)
		return
	}
	seconds := b.Timeout
	if refresh {
		seconds = b.Duration
	}
	d := defaultTimeout
	if seconds != nil {
		d = time.Duration(*seconds) * time.Second
	}
	if d < supervisor.MinLifetime || d > supervisor.MaxLifetime {
		writeError(w, http.StatusBadRequest, "The timeout must be from %d to %d seconds.", int(supervisor.MinLifetime.Seconds()), int(supervisor.MaxLifetime.Seconds()))
		return
	}
	on := st.OnTimeout
	if on == "" {
		on = supervisor.TimeoutDelete
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	if _, err := h.sup.SetTimeout(ctx, st.Config.ID, &supervisor.Lifetime{Timeout: d, OnTimeout: on}); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pauseBody is E2B's pause body: memory false keeps the file system alone (the SDKs'
// keepMemory), and a resume boots the sandbox afresh.
type pauseBody struct {
	Memory *bool `json:"memory"`
}

// pause freezes a running sandbox (its memory stays, as E2B's pause keeps it), or with
// memory false stops it (gracefully, then by force), which keeps its file system alone:
// connect then starts it again, as E2B resumes such a pause with a cold boot. 409 for a
// sandbox that E2B sees paused (every one that does not run or start).
func (h *Handler) pause(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	var b pauseBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "The request body is not valid JSON: %v.", err)
		return
	}
	if stateOf(st.State) == "paused" {
		writeError(w, http.StatusConflict, "Sandbox %s is already paused (it is %s).", st.Config.ID, st.State)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	var err error
	if b.Memory != nil && !*b.Memory {
		_, err = h.sup.Stop(ctx, st.Config.ID, false)
	} else {
		_, err = h.sup.Pause(ctx, st.Config.ID)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect answers with the sandbox running: 200 if it ran, 201 if it was resumed (a paused
// sandbox) or started again (a stopped one). A timeout in the body sets its lifetime anew.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	var b timeoutBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "The request body is not valid JSON: %v.", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	id := st.Config.ID
	status := http.StatusOK
	var err error
	switch st.State {
	case supervisor.StateRunning, supervisor.StateStarting:
	case supervisor.StatePaused:
		status = http.StatusCreated
		st, err = h.sup.Resume(ctx, id)
	default:
		status = http.StatusCreated
		st, err = h.sup.Start(ctx, id)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if b.Timeout != nil && *b.Timeout > 0 {
		on := st.OnTimeout
		if on == "" {
			on = supervisor.TimeoutDelete
		}
		if st, err = h.sup.SetTimeout(ctx, id, &supervisor.Lifetime{Timeout: time.Duration(*b.Timeout) * time.Second, OnTimeout: on}); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	writeJSON(w, status, h.created(st))
}

// listQuery is GET /v2/sandboxes's query.
type listQuery struct {
	metadata map[string]string
	states   []string
	limit    int
	after    string // the id after which the page starts ("" from the first)
}

func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{limit: 100, after: q.Get("nextToken")}
	if m := q.Get("metadata"); m != "" {
		// metadata is itself a query string (k=v&k2=v2) whose parts are escaped once more.
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return lq, errcode.Invalid("metadata", "The metadata filter is not a query string of key=value pairs.")
		}
		lq.metadata = map[string]string{}
		for k, v := range pairs {
			key, err1 := url.QueryUnescape(k)
			val, err2 := url.QueryUnescape(v[0])
			if err1 != nil || err2 != nil {
				return lq, errcode.Invalid("metadata", "The metadata filter is not escaped properly.")
			}
			lq.metadata[key] = val
		}
	}
	for _, s := range q["state"] {
		for part := range strings.SplitSeq(s, ",") {
			if part != "running" && part != "paused" {
				return lq, errcode.Invalid("state", "The state %q is none of running and paused.", part)
			}
			lq.states = append(lq.states, part)
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return lq, errcode.Invalid("limit", "The limit must be from 1 to 1000.")
		}
		lq.limit = n
	}
	return lq, nil
}

// match reports whether a sandbox passes the list's filters.
func (lq listQuery) match(d detailBody) bool {
	if len(lq.states) > 0 && !slices.Contains(lq.states, d.State) {
		return false
	}
	for k, v := range lq.metadata {
		if d.Metadata[k] != v {
			return false
		}
	}
	return true
}

// page filters the sandboxes, orders them by id and cuts the page that starts after lq.after;
// next is the token of the following page, "" at the end.
func (lq listQuery) page(all []detailBody) (items []detailBody, next string) {
	slices.SortFunc(all, func(a, b detailBody) int { return strings.Compare(a.SandboxID, b.SandboxID) })
	items = []detailBody{}
	for _, d := range all {
		if d.SandboxID <= lq.after || !lq.match(d) {
			continue
		}
		if len(items) == lq.limit {
			return items, items[len(items)-1].SandboxID
		}
		items = append(items, d)
	}
	return items, ""
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sts, err := h.sup.List()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	all := make([]detailBody, 0, len(sts))
	for _, st := range sts {
		if sandboxID.MatchString(st.Config.ID) {
			all = append(all, h.detailOf(st))
		}
	}
	items, next := lq.page(all)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, items)
}

// newID is a fresh sandbox id of E2B's form: 20 of a-z and 0-9, about 103 bits.
func newID() string { return naming.RandomAlnum(20) }
