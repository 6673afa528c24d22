package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/e2b/envd/filesystem/filesystemconnect"
	"github.com/bothy/bothy/e2b/envd/process/processconnect"
	"github.com/bothy/bothy/supervisor"
)

// sandboxKey carries an envd call's sandbox id into the Connect services.
type sandboxKey struct{}

func sandboxOf(ctx context.Context) string { id, _ := ctx.Value(sandboxKey{}).(string); return id }

// envdRoutes is the envd plane's route table: envd's REST routes and the two Connect
// services, whose handlers connect-go generates from e2b/envd's .proto files and which speak
// the Connect protocol (and gRPC, gRPC-Web) with its JSON and binary codecs.
func (h *Handler) envdRoutes() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /files", h.readFile)
	m.HandleFunc("POST /files", h.writeFiles)
	// A Connect message is bounded like a control-plane body: none of envd's is larger.
	limit := connect.WithReadMaxBytes(maxJSONBytes)
	p, ph := processconnect.NewProcessHandler(&processService{h: h}, limit)
	m.Handle(p, ph)
	f, fh := filesystemconnect.NewFilesystemHandler(&filesystemService{h: h}, limit)
	m.Handle(f, fh)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "bothyd's envd does not implement %s %s (see docs/e2b.md).", r.Method, r.URL.Path)
	})
	return m
}

// serveEnvd authenticates an envd call by its sandbox's access token and routes it.
func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(SandboxHeader)
	if r.URL.Path == "/health" && r.Method == http.MethodGet {
		h.health(w, r, id)
		return
	}
	if !sandboxID.MatchString(id) {
		writeError(w, http.StatusNotFound, "There is no sandbox %q: E2B's sandbox ids are a-z and 0-9 alone.", id)
		return
	}
	if !h.accessTokenOK(id, r.Header.Get("X-Access-Token")) {
		writeError(w, http.StatusUnauthorized, "The envd access token of sandbox %s is missing or wrong; take it from create or connect.", id)
		return
	}
	h.envd.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, id)))
}

// health is envd's GET /health as E2B's edge answers it: 204 while the sandbox runs, 502 while
// it does not (gone, paused, stopped, not yet started), which the SDKs' isRunning and
// is_running read as false and their error paths as "the sandbox is gone". It answers
// without credentials, as envd's own does, but then says nothing of the sandbox (204): only
// a caller with the sandbox's access token learns whether it runs.
func (h *Handler) health(w http.ResponseWriter, r *http.Request, id string) {
	if !sandboxID.MatchString(id) || !h.accessTokenOK(id, r.Header.Get("X-Access-Token")) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	st, err := h.sup.Status(id)
	switch {
	case statusOf(err) == http.StatusNotFound:
		writeError(w, http.StatusBadGateway, "Sandbox %s is not running: there is no such sandbox.", id)
	case err != nil:
		h.fail(w, r, err)
	case st.State != supervisor.StateRunning:
		writeError(w, http.StatusBadGateway, "Sandbox %s is not running: it is %s; connect to it to run it again.", id, st.State)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// userOf is the user a call acts as: the username it names, or the default user.
func userOf(r *http.Request) string {
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	return defaultUser
}

// fileError answers a file operation's failure as envd does: {code, message}.
func (h *Handler) fileError(w http.ResponseWriter, r *http.Request, err error) { h.fail(w, r, err) }

func (h *Handler) readFile(w http.ResponseWriter, r *http.Request) {
	p, err := resolvePath(r.URL.Query().Get("path"), userOf(r))
	if err != nil {
		writeError(w, http.StatusBadRequest, "%s.", upperFirst(err.Error()))
		return
	}
	rc, size, err := h.sup.ReadFile(r.Context(), sandboxOf(r.Context()), p, userOf(r))
	if err != nil {
		h.fileError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	_, _ = io.Copy(w, rc)
}

// writtenEntry is envd's EntryInfo of the REST API: what POST /files answers per file, its
// metadata as read back from the file.
type writtenEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataPrefix starts the upload headers that carry a file's metadata (envd 0.6.2).
const metadataPrefix = "X-Metadata-"

// uploadMetadata is the metadata an upload's headers carry: each X-Metadata-<key> header's
// first value under its key in lower case, as envd has it. Every file of the upload gets it;
// the file's former metadata goes with its former content.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var m map[string]string
	for name, values := range h {
		k, ok := strings.CutPrefix(name, metadataPrefix)
		if !ok || k == "" || len(values) == 0 {
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[strings.ToLower(k)] = values[0]
	}
	if err := control.ValidateMetadata(m); err != nil {
		return nil, err
	}
	return m, nil
}

// writeFiles stores the files of a POST /files: the body itself (application/octet-stream,
// optionally gzip) at ?path=, or each part of a multipart form at the path its filename
// holds (envd's form: the raw, unescaped destination), or at ?path= for a part without one.
func (h *Handler) writeFiles(w http.ResponseWriter, r *http.Request) {
	id, user := sandboxOf(r.Context()), userOf(r)
	dest := r.URL.Query().Get("path")
	meta, err := uploadMetadata(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%s", messageOf(err))
		return
	}
	body := http.MaxBytesReader(w, r.Body, h.cfg.MaxFileBytes)
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var written []writtenEntry
	write := func(p string, src io.Reader) bool {
		// As envd: a relative path (or none) is taken from the user's home.
		p, err := resolvePath(p, user)
		if err != nil {
			writeError(w, http.StatusBadRequest, "%s.", upperFirst(err.Error()))
			return false
		}
		req := supervisor.WriteRequest{Path: p, User: user, Mode: 0o644, MakeParents: true, Metadata: meta}
		if _, err := h.sup.WriteFile(r.Context(), id, req, src); err != nil {
			h.fileError(w, r, err)
			return false
		}
		e := writtenEntry{Path: p, Name: path.Base(p), Type: "file"}
		if len(meta) > 0 {
			// What was stored, as envd answers it: a file system without user attributes
			// stores none.
			if fi, err := h.sup.StatFile(r.Context(), id, path.Clean(p), user); err == nil {
				e.Metadata = fi.Metadata
			}
		}
		written = append(written, e)
		return true
	}
	if mt != "multipart/form-data" {
		var src io.Reader = body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(body)
			if err != nil {
				writeError(w, http.StatusBadRequest, "The body is not gzip, as its Content-Encoding says.")
				return
			}
			defer zr.Close()
			src = zr
		}
		if !write(dest, src) {
			return
		}
		writeJSON(w, http.StatusOK, written)
		return
	}
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "The multipart body is malformed: %v.", err)
			return
		}
		p := dest
		if name := rawFilename(part); name != "" {
			p = name
		}
		if !write(p, part) {
			return
		}
	}
	writeJSON(w, http.StatusOK, written)
}

// rawFilename is a part's filename as sent. envd's SDKs put the whole destination path there,
// which (*multipart.Part).FileName would cut to its last element.
func rawFilename(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// connectError is err as a Connect error: its code from bothyd's code, its message
// bothyd's own.
func connectError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connect.CodeInternal
	switch statusOf(err) {
	case http.StatusBadRequest:
		code = connect.CodeInvalidArgument
	case http.StatusNotFound:
		code = connect.CodeNotFound
	case http.StatusConflict:
		code = connect.CodeFailedPrecondition
	case http.StatusLocked, http.StatusTooManyRequests:
		code = connect.CodeResourceExhausted
	case http.StatusGatewayTimeout:
		code = connect.CodeDeadlineExceeded
	case http.StatusServiceUnavailable:
		code = connect.CodeUnavailable
	case http.StatusForbidden:
		code = connect.CodePermissionDenied
	}
	return connect.NewError(code, err)
}

// messageOf is the message of a refusal: a control.RemoteError's own, without its code.
func messageOf(err error) string {
	var re *control.RemoteError
	if errors.As(err, &re) {
		return re.Message
	}
	return err.Error()
}

// upperFirst starts a message with a capital, as a sentence.
func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
