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

func (h *Handlers) CreateTemplate(ctx context.Context, req openapi.CreateTemplateRequestObject) (openapi.CreateTemplateResponseObject, error) {
	ctx, cancel := deadline(ctx, nil, defaultTimeout)
	defer cancel()
	t, err := h.sup.CreateTemplate(ctx, req.Body.Name)
	if err != nil {
		return nil, err
	}
	location := "/v1/templates/" + t.Name
	return openapi.CreateTemplate201JSONResponse{
		Body:    apiTemplate(t),
		Headers: openapi.CreateTemplate201ResponseHeaders{Location: &location},
	}, nil
}

func (h *Handlers) ListTemplates(_ context.Context, req openapi.ListTemplatesRequestObject) (openapi.ListTemplatesResponseObject, error) {
	all, err := h.sup.ListTemplates()
	if err != nil {
		return nil, err
	}
	page, next, err := paginate(all, req.Params.Cursor, req.Params.Limit, func(t supervisor.Template) string { return t.Name })
	if err != nil {
		return nil, err
	}
	out := openapi.TemplateList{Items: make([]openapi.Template, 0, len(page)), NextCursor: next}
	for i := range page {
		out.Items = append(out.Items, apiTemplate(&page[i]))
	}
	return openapi.ListTemplates200JSONResponse(out), nil
}

func (h *Handlers) GetTemplate(_ context.Context, req openapi.GetTemplateRequestObject) (openapi.GetTemplateResponseObject, error) {
	t, err := h.sup.Template(req.Name)
	if err != nil {
		return nil, err
	}
	return openapi.GetTemplate200JSONResponse(apiTemplate(t)), nil
}

func (h *Handlers) DeleteTemplate(ctx context.Context, req openapi.DeleteTemplateRequestObject) (openapi.DeleteTemplateResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	out, err := h.sup.DeleteTemplate(ctx, req.Name, req.Params.Drain != nil && *req.Params.Drain)
	if err != nil {
		return nil, err
	}
	if out == supervisor.Draining {
		t, err := h.sup.Template(req.Name)
		if err != nil {
			return nil, err
		}
		return openapi.DeleteTemplate202JSONResponse(apiTemplate(t)), nil
	}
	return openapi.DeleteTemplate204Response{}, nil
}

func (h *Handlers) CaptureGeneration(ctx context.Context, req openapi.CaptureGenerationRequestObject) (openapi.CaptureGenerationResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	g, err := h.sup.Capture(ctx, req.Name, req.Body.Sandbox)
	if err != nil {
		return nil, err
	}
	location := "/v1/templates/" + req.Name + "/generations/" + g.ID
	return openapi.CaptureGeneration201JSONResponse{
		Body:    h.withPush(apiGeneration(g)),
		Headers: openapi.CaptureGeneration201ResponseHeaders{Location: &location},
	}, nil
}

func (h *Handlers) ListGenerations(_ context.Context, req openapi.ListGenerationsRequestObject) (openapi.ListGenerationsResponseObject, error) {
	all, err := h.sup.ListGenerations(req.Name)
	if err != nil {
		return nil, err
	}
	page, next, err := paginate(all, req.Params.Cursor, req.Params.Limit, func(g supervisor.Generation) string { return g.ID })
	if err != nil {
		return nil, err
	}
	out := openapi.GenerationList{Items: make([]openapi.Generation, 0, len(page)), NextCursor: next}
	for i := range page {
		out.Items = append(out.Items, h.withPush(apiGeneration(&page[i])))
	}
	return openapi.ListGenerations200JSONResponse(out), nil
}

func (h *Handlers) GetGeneration(_ context.Context, req openapi.GetGenerationRequestObject) (openapi.GetGenerationResponseObject, error) {
	g, err := h.sup.Generation(req.Name, req.Gen)
	if err != nil {
		return nil, err
	}
	return openapi.GetGeneration200JSONResponse(h.withPush(apiGeneration(g))), nil
}

func (h *Handlers) TombstoneGeneration(ctx context.Context, req openapi.TombstoneGenerationRequestObject) (openapi.TombstoneGenerationResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	g, err := h.sup.Tombstone(ctx, req.Name, req.Gen)
	if err != nil {
		return nil, err
	}
	return openapi.TombstoneGeneration200JSONResponse(h.withPush(apiGeneration(g))), nil
}

func (h *Handlers) RetireGeneration(ctx context.Context, req openapi.RetireGenerationRequestObject) (openapi.RetireGenerationResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	out, err := h.sup.Retire(ctx, req.Name, req.Gen, req.Params.Drain != nil && *req.Params.Drain)
	if err != nil {
		return nil, err
	}
	if out == supervisor.Draining {
		g, err := h.sup.Generation(req.Name, req.Gen)
		if err != nil {
			return nil, err
		}
		return openapi.RetireGeneration202JSONResponse(h.withPush(apiGeneration(g))), nil
	}
	return openapi.RetireGeneration204Response{}, nil
}

func (h *Handlers) ListLeases(_ context.Context, req openapi.ListLeasesRequestObject) (openapi.ListLeasesResponseObject, error) {
	leases, err := h.sup.Leases(req.Name, req.Gen)
	if err != nil {
		return nil, err
	}
	out := openapi.LeaseList{Items: make([]openapi.Lease, 0, len(leases))}
	for _, l := range leases {
		out.Items = append(out.Items, openapi.Lease{ID: l.ID, Sandbox: l.Sandbox, AcquiredAt: l.AcquiredAt})
	}
	return openapi.ListLeases200JSONResponse(out), nil
}

func apiTemplate(t *supervisor.Template) openapi.Template {
	out := openapi.Template{Name: t.Name, CreatedAt: t.CreatedAt, Generations: t.Generations}
	if t.Latest != "" {
		latest := t.Latest
		out.Latest = &latest
	}
	return out
}

func apiGeneration(g *supervisor.Generation) openapi.Generation {
	out := openapi.Generation{
		ID:          g.ID,
		Template:    g.Template,
		State:       openapi.GenerationState(g.State),
		Eligibility: openapi.GenerationEligibility(g.Eligibility),
		CapturedAt:  g.CapturedAt,
		SizeBytes:   g.SizeBytes,
		Leases:      g.Leases,
		Key: openapi.CompatibilityKey{
			Runtime:   g.Key.Runtime,
			Image:     g.Key.Image,
			Resources: apiResources(g.Key.Resources, 0), // a clone's disk is its own, not the key's
		},
	}
	if g.CapturePauseMS > 0 {
		pause := g.CapturePauseMS
		out.CapturePauseMs = &pause
	}
	if src := g.Source; src != nil {
		out.Source = &openapi.GenerationSource{Sandbox: src.Sandbox}
		if src.Template != "" {
			out.Source.Template, out.Source.Generation = &src.Template, &src.Generation
		}
	}
	return out
}

// withPush adds where the generation's push to the template registry stands, when this
// process pushed it.
func (h *Handlers) withPush(g openapi.Generation) openapi.Generation {
	st, ok := h.sup.PushState(g.Template, g.ID)
	if !ok {
		return g
	}
	r := openapi.GenerationPush{State: openapi.GenerationPushState(st.State)}
	if st.Digest != "" {
		r.Digest = &st.Digest
	}
	if st.Error != "" {
		r.Error = &st.Error
	}
	g.Registry = &r
	return g
}

// paginate returns the page of items (sorted by key) after the cursor, and the cursor of the
// next page. A cursor is the last key of a page, base64url-encoded: opaque to clients, and
// stable while items come and go.
func paginate[T any](items []T, cursor *string, limit *int, key func(T) string) ([]T, *string, error) {
	return paginateKeys(items, cursor, limit, key, naming.ValidID)
}

// paginateKeys is paginate for keys of another rule than the id rule (image names, which
// may hold '.' and '_'): valid says whether a cursor is a key of that rule.
func paginateKeys[T any](items []T, cursor *string, limit *int, key func(T) string, valid func(string) bool) ([]T, *string, error) {
	after, n, err := pageBoundsOf(cursor, limit, valid)
	if err != nil {
		return nil, nil, err
	}
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b T) int { return strings.Compare(key(a), key(b)) })
	var page []T
	for _, it := range sorted {
		if strings.Compare(key(it), after) <= 0 {
			continue
		}
		if len(page) == n {
			next := key(page[len(page)-1])
			return page, &next, nil
		}
		page = append(page, it)
	}
	return page, nil, nil
}

// pageBounds decodes a listing's cursor into the key that its page starts after ("" for the
// first page), and its limit into the page's size.
func pageBounds(cursor *string, limit *int) (string, int, error) {
	return pageBoundsOf(cursor, limit, naming.ValidID)
}

// pageBoundsOf is pageBounds for cursors that valid accepts.
func pageBoundsOf(cursor *string, limit *int, valid func(string) bool) (string, int, error) {
	after := ""
	if cursor != nil {
		// A cursor is the key (a sandbox id, a template name, a generation id) its page starts
		// after, so that every cursor of the contract's pattern (the id rule) names a position
		// (issue 38): the contract, not the server, says which cursors are valid.
		if !valid(*cursor) {
			return "", 0, errcode.Invalid("cursor", "The cursor is not one this server returned; start again without it.")
		}
		after = *cursor
	}
	n := defaultListLimit
	if limit != nil {
		n = *limit
	}
	return after, n, nil
}
