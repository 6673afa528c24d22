package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/store/template"
	"github.com/bothy/bothy/supervisor"
)

// E2B's fork and snapshots (docs/e2b.md). A fork is bothyd's fork (docs/checkpoints.md),
// each fork with E2B's lifetime. A snapshot is what E2B makes of it: a template that new
// sandboxes are created from, so it is one of bothyd's templates, named
// snap-<sandbox>-<name or random>, with one generation captured from the sandbox (a running
// one frozen for it); E2B deletes it as a template, and creates from it by its id.

// Forker is what fork and snapshots need of the supervisor beyond [Supervisor]; a
// supervisor without it answers them 501.
type Forker interface {
	Fork(ctx context.Context, id string, req supervisor.ForkRequest) (*supervisor.ForkResult, error)
	CreateTemplate(ctx context.Context, name string) (*supervisor.Template, error)
	ListTemplates() ([]supervisor.Template, error)
	DeleteTemplate(ctx context.Context, name string, drain bool) (template.Outcome, error)
	Capture(ctx context.Context, template, sandbox string) (*template.Generation, error)
}

var _ Forker = (*supervisor.Supervisor)(nil)

// snapshotPrefix marks the templates that are E2B snapshots.
const snapshotPrefix = "snap-"

func (h *Handler) forker(w http.ResponseWriter) (Forker, bool) {
	f, ok := h.sup.(Forker)
	if !ok {
		writeError(w, http.StatusNotImplemented, "This server has no fork or snapshots.")
	}
	return f, ok
}

// forkBody is E2B's fork request: the forks' lifetime in seconds and their count.
type forkBody struct {
	Timeout *int `json:"timeout"`
	Count   *int `json:"count"`
}

// forkResult is one of E2B's per-fork results.
type forkResult struct {
	Sandbox *created  `json:"sandbox,omitempty"`
	Error   *apiError `json:"error,omitempty"`
}

func (h *Handler) fork(w http.ResponseWriter, r *http.Request) {
	f, ok := h.forker(w)
	if !ok {
		return
	}
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	var b forkBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "The request body is not a valid JSON fork: %v.", err)
		return
	}
	n := 1
	if b.Count != nil {
		n = *b.Count
	}
	if n < 1 || n > supervisor.MaxForks {
		writeError(w, http.StatusBadRequest, "A fork makes 1 to %d sandboxes; ask for a count in that range.", supervisor.MaxForks)
		return
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newID()
	}
	lt := &supervisor.Lifetime{Timeout: defaultTimeout, OnTimeout: supervisor.TimeoutDelete}
	if b.Timeout != nil && *b.Timeout > 0 {
		lt.Timeout = time.Duration(*b.Timeout) * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	res, err := f.Fork(ctx, st.Config.ID, supervisor.ForkRequest{IDs: ids})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := make([]forkResult, 0, len(res.Forks))
	for _, fk := range res.Forks {
		if fk.Err == nil {
			// E2B's forks die at the end of their timeout, as a created sandbox does.
			if _, err := h.sup.SetTimeout(ctx, fk.ID, lt); err != nil {
				fk.Err = err
			}
		}
		if fk.Err != nil {
			status := statusOf(fk.Err)
			msg := fk.Err.Error()
			if status == http.StatusInternalServerError {
				h.log.Error("e2b: a fork failed", "sandbox", st.Config.ID, "fork", fk.ID, "err", fk.Err)
				msg = "The server failed to make this fork; see its log."
			}
			out = append(out, forkResult{Error: &apiError{Code: status, Message: msg}})
			continue
		}
		c := h.created(fk.Status)
		out = append(out, forkResult{Sandbox: &c})
	}
	writeJSON(w, http.StatusOK, out)
}

// snapshotBody is E2B's snapshot request: an optional name.
type snapshotBody struct {
	Name string `json:"name"`
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// snapshotName is the template of a snapshot of sandbox id named name ("": a random one).
func snapshotName(id, name string) (string, error) {
	if name == "" {
		name = naming.RandomHex(8)
	}
	t := snapshotPrefix + id + "-" + name
	if err := template.ValidateName(t); err != nil {
		return "", errcode.Invalid("name", "The snapshot name %q cannot name a template (%s-<sandbox>-<name>, at most 63 characters of a-z, 0-9 and '-'); choose another.", name, strings.TrimSuffix(snapshotPrefix, "-"))
	}
	return t, nil
}

func infoOf(t string) snapshotInfo {
	// The name is what follows "snap-<20 characters of sandbox id>-".
	names := []string{}
	if rest := strings.TrimPrefix(t, snapshotPrefix); len(rest) > 21 {
		names = append(names, rest[21:])
	}
	return snapshotInfo{SnapshotID: t, Names: names}
}

func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request) {
	f, ok := h.forker(w)
	if !ok {
		return
	}
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	var b snapshotBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "The request body is not a valid JSON snapshot: %v.", err)
		return
	}
	name, err := snapshotName(st.Config.ID, b.Name)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	if _, err := f.CreateTemplate(ctx, name); err != nil {
		h.fail(w, r, err)
		return
	}
	if _, err := f.Capture(ctx, name, st.Config.ID); err != nil {
		// An empty template is no snapshot: remove it again.
		if _, derr := f.DeleteTemplate(ctx, name, false); derr != nil {
			h.log.Warn("e2b: removing the template of a failed snapshot", "template", name, "err", derr)
		}
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, infoOf(name))
}

func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) {
	f, ok := h.forker(w)
	if !ok {
		return
	}
	all, err := f.ListTemplates()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	prefix := snapshotPrefix
	if id := r.URL.Query().Get("sandboxID"); id != "" {
		prefix += id + "-"
	}
	name := r.URL.Query().Get("name")
	out := []snapshotInfo{}
	for _, t := range all {
		if !strings.HasPrefix(t.Name, prefix) {
			continue
		}
		info := infoOf(t.Name)
		if name != "" && !slices.Contains(info.Names, name) {
			continue
		}
		out = append(out, info)
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is E2B's template delete, which its SDKs use to delete a snapshot: a
// template is retired once its clones are gone (drain).
func (h *Handler) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	f, ok := h.forker(w)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), transitionTimeout)
	defer cancel()
	if _, err := f.DeleteTemplate(ctx, r.PathValue("id"), true); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
