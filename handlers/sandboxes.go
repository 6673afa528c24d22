package handlers

import (
	"context"
	"slices"
	"strings"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

func (h *Handlers) CreateSandbox(ctx context.Context, req openapi.CreateSandboxRequestObject) (openapi.CreateSandboxResponseObject, error) {
	body := req.Body
	if body == nil {
		body = &openapi.CreateSandboxRequest{}
	}
	creq, err := h.createRequest(body)
	if err != nil {
		return nil, err
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	st, err := h.sup.Create(ctx, creq)
	if err != nil {
		return nil, err
	}
	location := "/v1/sandboxes/" + creq.ID
	return openapi.CreateSandbox201JSONResponse{
		Body:    apiSandbox(st),
		Headers: openapi.CreateSandbox201ResponseHeaders{Location: &location},
	}, nil
}

// createRequest maps a create request onto the supervisor's, with the server's defaults for
// what it leaves out, and checks what the contract cannot say (label keys, a generation
// without its template).
func (h *Handlers) createRequest(body *openapi.CreateSandboxRequest) (supervisor.CreateRequest, error) {
	if body.Generation != nil && body.Template == nil {
		return supervisor.CreateRequest{}, errcode.Invalid("generation", "A generation belongs to a template: name the template too.")
	}
	creq := supervisor.CreateRequest{
		ID:        deref(body.ID),
		Image:     deref(body.Image),
		Resources: h.cfg.DefaultResources,
		DiskMB:    h.cfg.DefaultDiskMB,
	}
	if creq.ID == "" {
		creq.ID, creq.AnyID = supervisor.NewSandboxID(), true
	}
	creq.Start = body.Start != nil && *body.Start
	seconds := h.cfg.DefaultTimeoutS
	if body.TimeoutS != nil && *body.TimeoutS > 0 {
		seconds = *body.TimeoutS
	}
	creq.Lifetime = lifetime(seconds, body.OnTimeout)
	if p := body.Sleep; p != nil {
		creq.Sleep = &supervisor.SleepPolicy{IdleTimeoutS: p.IdleTimeoutSeconds, AutoResume: p.AutoResume == nil || *p.AutoResume,
			IgnoreWork: p.IdleIgnoresWork != nil && *p.IdleIgnoresWork}
	}
	if body.Volumes != nil {
		for _, v := range *body.Volumes {
			creq.Volumes = append(creq.Volumes, supervisor.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly != nil && *v.ReadOnly})
		}
	}
	if body.Runtime != nil {
		creq.Runtime = string(*body.Runtime)
		if *body.Runtime != openapi.RuntimeKindNamespace {
			// The server's default disk is a namespace sandbox's (a loop-mounted image); a
			// microVM's disk is its overlay, with the runtime's default room unless the
			// create names disk_mb.
			creq.DiskMB = 0
		}
	}
	chosen := applyResources(&creq, body.Resources)
	env, err := envMap("env", body.Env)
	if err != nil {
		return supervisor.CreateRequest{}, err
	}
	creq.Env = env
	creq.Network = policyOf(body.Network)
	if body.Labels != nil {
		if err := checkLabels(*body.Labels); err != nil {
			return supervisor.CreateRequest{}, err
		}
		creq.Labels = *body.Labels
	}
	if body.Template != nil {
		creq.Clone = &supervisor.CloneRequest{Template: *body.Template, Generation: deref(body.Generation), Image: creq.Image,
			Runtime: creq.Runtime, DiskDefault: body.Resources == nil || body.Resources.DiskMb == nil}
		// The disk is the clone's own; the limits it names override the generation's, the
		// others are the generation's, not the server's defaults.
		if chosen {
			creq.Clone.Resources = cloneLimits(body.Resources)
		}
	}
	return creq, nil
}

// applyResources overrides the defaults in creq with the limits r names, and reports whether
// it named any but the disk.
func applyResources(creq *supervisor.CreateRequest, r *openapi.ResourcesRequest) (chosen bool) {
	if r == nil {
		return false
	}
	if r.Vcpus != nil {
		creq.Resources.VCPUs = *r.Vcpus
	}
	if r.MemoryMb != nil {
		creq.Resources.MemoryMB = *r.MemoryMb
	}
	if r.Pids != nil {
		creq.Resources.Pids = *r.Pids
	}
	if r.DiskMb != nil {
		creq.DiskMB = *r.DiskMb
	}
	return r.Vcpus != nil || r.MemoryMb != nil || r.Pids != nil
}

// cloneLimits are the limits a clone's request names, 0 for each it leaves to the generation.
func cloneLimits(r *openapi.ResourcesRequest) *supervisor.Resources {
	or0 := func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
	return &supervisor.Resources{VCPUs: or0(r.Vcpus), MemoryMB: or0(r.MemoryMb), Pids: or0(r.Pids)}
}

// checkLabels refuses labels that break the label rules (naming.CheckLabels, which E2B's
// metadata is held to as well).
func checkLabels(labels map[string]string) error {
	if err := naming.CheckLabels(labels); err != nil {
		return errcode.Invalid("labels", "The labels are not valid: %v.", err)
	}
	return nil
}

// deref is a pointer's string, or "" for nil.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// envMap turns KEY=VALUE entries (their form checked by the contract) into a map.
func envMap(field string, env *[]string) (map[string]string, error) {
	if env == nil || len(*env) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(*env))
	for _, kv := range *env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, errcode.Invalid(field, "The environment entry %q is not of the form KEY=VALUE.", kv)
		}
		m[k] = v
	}
	return m, nil
}

func (h *Handlers) GetSandbox(_ context.Context, req openapi.GetSandboxRequestObject) (openapi.GetSandboxResponseObject, error) {
	st, err := h.sup.Status(req.ID)
	if err != nil {
		return nil, err
	}
	return openapi.GetSandbox200JSONResponse(apiSandbox(st)), nil
}

func (h *Handlers) ListSandboxes(_ context.Context, req openapi.ListSandboxesRequestObject) (openapi.ListSandboxesResponseObject, error) {
	p := req.Params
	selectors := map[string]string{}
	if p.Label != nil {
		for _, sel := range *p.Label {
			k, v, ok := strings.Cut(sel, "=")
			if !ok || !naming.ValidLabelKey(k) {
				return nil, errcode.Invalid("label", "The label selector %q is not of the form key=value.", sel)
			}
			selectors[k] = v
		}
	}
	after, n, err := pageBounds(p.Cursor, p.Limit)
	if err != nil {
		return nil, err
	}
	page, more, err := h.sup.ListPage(after, n, func(st *supervisor.Status) bool {
		return (p.State == nil || string(st.State) == string(*p.State)) && matchLabels(st.Config.Labels, selectors)
	})
	if err != nil {
		return nil, err
	}
	var next *string
	if more && len(page) > 0 {
		c := page[len(page)-1].Config.ID
		next = &c
	}
	out := openapi.SandboxList{Items: make([]openapi.Sandbox, 0, len(page)), NextCursor: next}
	for _, st := range page {
		out.Items = append(out.Items, apiSandbox(st))
	}
	return openapi.ListSandboxes200JSONResponse(out), nil
}

func matchLabels(labels, selectors map[string]string) bool {
	for k, v := range selectors {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (h *Handlers) DeleteSandbox(ctx context.Context, req openapi.DeleteSandboxRequestObject) (openapi.DeleteSandboxResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	force := req.Params.Force != nil && *req.Params.Force
	if err := h.sup.Delete(ctx, req.ID, force); err != nil {
		return nil, err
	}
	return openapi.DeleteSandbox204Response{}, nil
}

func (h *Handlers) StartSandbox(ctx context.Context, req openapi.StartSandboxRequestObject) (openapi.StartSandboxResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	st, err := h.sup.Start(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return openapi.StartSandbox200JSONResponse(apiSandbox(st)), nil
}

func (h *Handlers) StopSandbox(ctx context.Context, req openapi.StopSandboxRequestObject) (openapi.StopSandboxResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	force := req.Params.Force != nil && *req.Params.Force
	st, err := h.sup.Stop(ctx, req.ID, force)
	if err != nil {
		return nil, err
	}
	return openapi.StopSandbox200JSONResponse(apiSandbox(st)), nil
}

func (h *Handlers) GetSandboxLogs(_ context.Context, req openapi.GetSandboxLogsRequestObject) (openapi.GetSandboxLogsResponseObject, error) {
	tail := 0
	if req.Params.Tail != nil {
		tail = *req.Params.Tail
	}
	b, err := h.sup.Logs(req.ID, tail)
	if err != nil {
		return nil, err
	}
	return openapi.GetSandboxLogs200TextResponse(b), nil
}

// apiSandbox is the contract's view of a sandbox.
func apiSandbox(st *supervisor.Status) openapi.Sandbox {
	c := st.Config
	sb := openapi.Sandbox{
		ID:        c.ID,
		State:     openapi.SandboxState(st.State),
		Runtime:   openapi.RuntimeKind(st.Runtime),
		Image:     c.Image,
		Labels:    c.Labels,
		Resources: apiResources(c.Resources, c.DiskMB),
		CreatedAt: c.CreatedAt,
		StartedAt: st.StartedAt,
		ExpiresAt: st.ExpiresAt,
	}
	if st.OnTimeout != "" {
		on := openapi.OnTimeout(st.OnTimeout)
		sb.OnTimeout = &on
	}
	if len(c.Volumes) > 0 {
		vols := make([]openapi.VolumeMount, 0, len(c.Volumes))
		for _, v := range c.Volumes {
			ro := v.ReadOnly
			vols = append(vols, openapi.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: &ro})
		}
		sb.Volumes = &vols
	}
	if p := c.Sleep; p != nil {
		sb.Sleep = &openapi.SleepPolicy{IdleTimeoutSeconds: p.IdleTimeoutS, AutoResume: &p.AutoResume, IdleIgnoresWork: &p.IgnoreWork}
		asleep := st.Asleep
		sb.Asleep = &asleep
	}
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	if b := st.Binding; b != nil {
		sb.Template = &openapi.TemplateBinding{Template: b.Template, Generation: b.Generation, Lease: b.Lease}
	}
	if len(c.Env) > 0 {
		keys := make([]string, 0, len(c.Env))
		for k := range c.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		sb.EnvKeys = &keys
	}
	if o := st.LastExit; o != nil {
		le := &openapi.LastExit{At: o.At, Reason: exitReason(o)}
		if o.ExitCode >= 0 && o.Signal == "" {
			code := o.ExitCode
			le.Code = &code
		}
		if o.Signal != "" {
			sig := o.Signal
			le.Signal = &sig
		}
		sb.LastExit = le
	}
	apiNetwork(&sb, st.Network)
	return sb
}

func exitReason(o *supervisor.Exit) openapi.LastExitReason {
	switch o.Reason {
	case supervisor.ReasonSignaled, supervisor.ReasonKilled:
		return openapi.LastExitReasonKilled
	case supervisor.ReasonOOM:
		return openapi.LastExitReasonOom
	case supervisor.ReasonStopped:
		return openapi.LastExitReasonStopped
	case supervisor.ReasonStartFailed:
		return openapi.LastExitReasonStartFailed
	case supervisor.ReasonExited:
		return openapi.LastExitReasonExited
	case supervisor.ReasonExpired:
		return openapi.LastExitReasonExpired
	}
	return openapi.LastExitReasonLost
}

func apiResources(r supervisor.Resources, diskMB int) openapi.Resources {
	return openapi.Resources{Vcpus: r.VCPUs, MemoryMb: r.MemoryMB, Pids: r.Pids, DiskMb: diskMB}
}
