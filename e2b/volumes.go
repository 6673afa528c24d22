package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/volume"
)

// E2B's volumes map onto bothyd's (package volume, docs/volumes.md): E2B's volume id is the
// volume's name, which bothyd's names are unique by; a create takes the server's default
// size, E2B's NewVolume naming none. The control plane (/volumes) authenticates as every
// control call does (X-API-Key); the content API (/volumecontent/{volumeID}/...), which the
// SDK reaches at E2B_VOLUME_API_URL, takes the volume's own token as a bearer token: an HMAC
// of the server's token and the volume's id, so that a token handed out for one volume
// reaches that volume's files alone, and never the API.

// volumeBody is E2B's Volume and VolumeAndToken.
type volumeBody struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
}

// volumeToken is the content token of volume id: "" without a server token.
func (h *Handler) volumeToken(id string) string { return VolumeToken(h.cfg.Token, id) }

// VolumeToken is the content token of volume id under a server's token: "" without one. A
// cluster's router, which holds its nodes' token, checks it before it routes a content call.
func VolumeToken(token, id string) string {
	if token == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("bothyd e2b volume token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

func (h *Handler) volumes(w http.ResponseWriter) (*volume.Store, bool) {
	if h.cfg.Volumes == nil {
		writeError(w, http.StatusNotImplemented, "This bothyd keeps no volumes.")
		return nil, false
	}
	return h.cfg.Volumes, true
}

func (h *Handler) volumeOut(v *volume.Volume, token bool) volumeBody {
	b := volumeBody{VolumeID: v.Name, Name: v.Name}
	if token {
		b.Token = h.volumeToken(v.Name)
	}
	return b
}

func (h *Handler) createVolume(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumes(w)
	if !ok {
		return
	}
	var b struct {
		Name string `json:"name"`
	}
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		writeError(w, http.StatusBadRequest, "The body is not E2B's NewVolume: %v.", err)
		return
	}
	v, err := vs.Create(r.Context(), b.Name, 0)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.volumeOut(v, true))
}

func (h *Handler) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumes(w)
	if !ok {
		return
	}
	list, err := vs.List()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := make([]volumeBody, 0, len(list))
	for _, v := range list {
		out = append(out, h.volumeOut(v, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) getVolume(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumes(w)
	if !ok {
		return
	}
	v, err := vs.Get(r.PathValue("volumeID"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h.volumeOut(v, true))
}

func (h *Handler) deleteVolume(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumes(w)
	if !ok {
		return
	}
	if err := vs.Delete(r.PathValue("volumeID")); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeMounts maps E2B's volumeMounts onto bothyd's mounts (read-write: E2B's have no mode).
func volumeMounts(in []struct {
	Name string `json:"name"`
	Path string `json:"path"`
}) []supervisor.VolumeMount {
	var out []supervisor.VolumeMount
	for _, m := range in {
		out = append(out, supervisor.VolumeMount{Name: m.Name, Path: m.Path})
	}
	return out
}

// entryStat is E2B's VolumeEntryStat.
type entryStat struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"`
	Type   string    `json:"type"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	ATime  time.Time `json:"atime"`
	MTime  time.Time `json:"mtime"`
	CTime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

func statOf(e *volume.Entry) entryStat {
	t := e.Type
	if t == "other" {
		t = "unknown"
	}
	return entryStat{Name: e.Name, Path: e.Path, Type: t, Size: e.Size, Mode: e.Mode, UID: e.UID, GID: e.GID,
		ATime: e.ATime, MTime: e.ModTime, CTime: e.CTime, Target: e.Target}
}

// isVolumeContent reports whether r is a call of E2B's volume content API.
func isVolumeContent(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/volumecontent/") }

// maxVolumeOps bounds the volume content calls in flight at once (each holds a descriptor of
// the volume, a read until its body is sent), as bothyd's own file operations are bounded.
const maxVolumeOps = 256

// serveVolumeContent authenticates a content call by its volume's token and serves it.
func (h *Handler) serveVolumeContent(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/volumecontent/")
	id, op, _ := strings.Cut(rest, "/")
	got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if want := h.volumeToken(id); want != "" && !hmac.Equal([]byte(got), []byte(want)) {
		writeError(w, http.StatusUnauthorized, "Invalid volume token: connect to the volume (Volume.connect) for its token.")
		return
	}
	vs, ok := h.volumes(w)
	if !ok {
		return
	}
	select {
	case h.volumeOps <- struct{}{}:
		defer func() { <-h.volumeOps }()
	default:
		writeError(w, http.StatusServiceUnavailable, "The server has %d volume file calls in flight, the most it takes; retry shortly.", maxVolumeOps)
		return
	}
	q := r.URL.Query()
	p := q.Get("path")
	opts, err := writeOptions(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var e *volume.Entry
	switch r.Method + " " + op {
	case "GET dir":
		h.listVolumeDir(w, r, vs, id, p)
		return
	case "POST dir":
		e, err = vs.Mkdir(id, p, opts)
	case "GET path":
		e, err = vs.Stat(id, p)
	case "DELETE path":
		if err = vs.Remove(id, p, true); err == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	case "GET file":
		rc, size, oerr := vs.Open(id, p)
		if oerr != nil {
			h.fail(w, r, oerr)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		_, _ = io.Copy(w, rc)
		return
	case "PUT file":
		opts.Parents = true
		e, err = vs.Write(id, p, r.Body, opts)
	default:
		writeError(w, http.StatusNotImplemented, "bothyd does not implement %s %s of E2B's volume API (see docs/e2b.md).", r.Method, r.URL.Path)
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, statOf(e))
}

// maxVolumeListDepth bounds E2B's recursive listing of a volume.
const maxVolumeListDepth = 8

// listVolumeDir answers E2B's listing of path, depth levels deep (1: the directory's own
// entries), at most volume.MaxListEntries entries in all.
func (h *Handler) listVolumeDir(w http.ResponseWriter, r *http.Request, vs *volume.Store, id, p string) {
	depth := 1
	if d, err := strconv.Atoi(r.URL.Query().Get("depth")); err == nil && d > 0 {
		depth = min(d, maxVolumeListDepth)
	}
	out := []entryStat{}
	dirs := []string{p}
	for level := 0; level < depth && len(dirs) > 0 && len(out) < volume.MaxListEntries; level++ {
		var next []string
		for _, d := range dirs {
			if len(out) == volume.MaxListEntries {
				break // full: no more directories are read
			}
			ents, err := vs.ListDir(id, d)
			if err != nil {
				if level == 0 {
					h.fail(w, r, err)
					return
				}
				continue
			}
			for i := range ents {
				if len(out) == volume.MaxListEntries {
					break
				}
				out = append(out, statOf(&ents[i]))
				if ents[i].Type == "directory" {
					next = append(next, path.Join("/", ents[i].Path))
				}
			}
		}
		dirs = next
	}
	writeJSON(w, http.StatusOK, out)
}

// writeOptions reads E2B's uid, gid, mode and force (make parents) of a write or a mkdir.
func writeOptions(q map[string][]string) (volume.WriteOptions, error) {
	var o volume.WriteOptions
	num := func(name string) (*uint32, error) {
		v := ""
		if vs := q[name]; len(vs) > 0 {
			v = vs[0]
		}
		if v == "" {
			return nil, nil
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, errcode.Invalid(name, "%s must be a number.", name)
		}
		u := uint32(n)
		return &u, nil
	}
	var err error
	if o.UID, err = num("uid"); err != nil {
		return o, err
	}
	if o.GID, err = num("gid"); err != nil {
		return o, err
	}
	if o.Mode, err = num("mode"); err != nil {
		return o, err
	}
	if f := q["force"]; len(f) > 0 && f[0] == "true" {
		o.Parents = true
	}
	return o, nil
}
