package router

import (
	"bytes"
	"crypto/hmac"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/cluster/placement"
	"github.com/bothy/bothy/e2b"
)

// E2B's API through the router (docs/cluster.md, "E2B's API through the router"). The
// control plane's calls on a sandbox (/sandboxes/{id}/..., /v2/sandboxes/{id}) and the envd
// plane's (any path, the sandbox named in the E2b-Sandbox-Id header) go to the sandbox's node
// as bothy's own do; creates are placed; the lists and the metrics of several sandboxes are
// asked of every live node and merged; volumes go to their node (volumes.go), secrets to every
// node (secrets.go), snapshots as templates do (snapshots.go). The rest of E2B's template API
// answers 501 in E2B's shape.

// maxE2BCreateBytes bounds an E2B create's body, as a node bounds it.
const maxE2BCreateBytes = 1 << 20

// e2bError answers in E2B's error shape, which E2B's SDKs read.
func e2bError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// e2bKeyOK reports whether key is the router's token, bare or behind E2B's e2b_ prefix, as a
// node accepts its own.
func (rt *Router) e2bKeyOK(key string) bool {
	if rt.cfg.Token == "" {
		return true
	}
	key = strings.TrimPrefix(key, "e2b_")
	return key != "" && subtle.ConstantTimeCompare([]byte(key), []byte(rt.cfg.Token)) == 1
}

// nodeAPIKey puts the node token where E2B's control plane reads it.
func (rt *Router) nodeAPIKey(h http.Header) {
	h.Del("Authorization")
	h.Del("X-API-KEY")
	if rt.cfg.NodeToken != "" {
		h.Set("X-API-KEY", rt.cfg.NodeToken)
	}
}

// serveE2B routes a call that e2b.Claims claims.
func (rt *Router) serveE2B(w http.ResponseWriter, req *http.Request) {
	if id := req.Header.Get(e2b.SandboxHeader); id != "" {
		rt.serveEnvd(w, req, id)
		return
	}
	if rest, ok := strings.CutPrefix(req.URL.Path, "/volumecontent/"); ok {
		id, _, _ := strings.Cut(rest, "/")
		rt.serveVolumeContent(w, req, id)
		return
	}
	if !rt.e2bKeyOK(req.Header.Get("X-API-KEY")) {
		e2bError(w, http.StatusUnauthorized, "Invalid API key: set E2B_API_KEY to the router's token, optionally behind the prefix e2b_ (see docs/e2b.md).")
		return
	}
	p := req.URL.Path
	list := p == "/sandboxes" || p == "/v2/sandboxes"
	switch {
	case list && req.Method == http.MethodPost:
		rt.e2bCreate(w, req)
	case list && req.Method == http.MethodGet:
		rt.e2bList(w, req)
	case p == "/sandboxes/metrics" && req.Method == http.MethodGet:
		rt.e2bMetrics(w, req)
	case p == "/volumes" || strings.HasPrefix(p, "/volumes/"):
		rt.e2bVolumes(w, req)
	case p == "/snapshots" && req.Method == http.MethodGet:
		rt.e2bListSnapshots(w, req) // snapshots.go
	case strings.HasPrefix(p, "/templates/") && req.Method == http.MethodDelete:
		rt.e2bDeleteTemplate(w, req)
	case snapshotOf(req) != "":
		rt.e2bSnapshot(w, req, snapshotOf(req))
	case p == "/secrets" || strings.HasPrefix(p, "/secrets/"):
		rt.e2bSecrets(w, req) // secrets.go
	case strings.HasPrefix(p, "/sandboxes/") || strings.HasPrefix(p, "/v2/sandboxes/"):
		rest := strings.TrimPrefix(strings.TrimPrefix(p, "/v2"), "/sandboxes/")
		id, _, _ := strings.Cut(rest, "/")
		if id == "" {
			e2bError(w, http.StatusNotFound, "Name a sandbox: /sandboxes/{id}.")
			return
		}
		rt.proxyTo(w, req, id, planeE2B)
	default:
		e2bError(w, http.StatusNotImplemented, fmt.Sprintf("The cluster router does not serve %s %s of E2B's API yet: E2B's templates are built on one node (docs/cluster.md). Call a node directly for them.", req.Method, p))
	}
}

// serveEnvd routes an envd call to the sandbox's node. The router checks the sandbox's access
// token (the node's, which the node handed out at create) before it looks the sandbox up, so
// that a caller without it learns nothing of the cluster and makes the router ask no node;
// /health answers such a caller 204, as a node's does.
func (rt *Router) serveEnvd(w http.ResponseWriter, req *http.Request, id string) {
	want := e2b.AccessToken(rt.cfg.NodeToken, id)
	if want != "" && !hmac.Equal([]byte(req.Header.Get("X-Access-Token")), []byte(want)) {
		if req.URL.Path == "/health" && req.Method == http.MethodGet {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		e2bError(w, http.StatusUnauthorized, fmt.Sprintf("The envd access token of sandbox %s is missing or wrong; take it from create or connect.", id))
		return
	}
	rt.proxyTo(w, req, id, planeEnvd)
}

// e2bCreate places an E2B create and forwards it; the node makes the id, which the router
// reads from the answer to remember where it placed it.
func (rt *Router) e2bCreate(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxE2BCreateBytes+1))
	if err != nil || len(body) > maxE2BCreateBytes {
		e2bError(w, http.StatusBadRequest, "The create request could not be read, or is over 1 MiB; send a smaller one.")
		return
	}
	var cr struct {
		TemplateID   string        `json:"templateID"`
		VolumeMounts []volumeMount `json:"volumeMounts"`
	}
	_ = json.Unmarshal(body, &cr) // the node refuses what does not parse, as on one node
	nodes, ok := rt.readNodes(w, req, planeE2B)
	if !ok {
		return
	}
	// A sandbox that mounts volumes runs on their node, as bothy's create does.
	volumesOn, ok := rt.volumesNode(w, planeE2B, nodes, cr.VolumeMounts)
	if !ok {
		return
	}
	// A create from a snapshot this router just made is placed beside it (snapshots.go), one
	// from an image it just imported on a node that holds it (images.go).
	rt.withRecentCapture(nodes, cr.TemplateID)
	rt.withRecentImport(nodes, cr.TemplateID)
	// E2B's create names no resources: the node's defaults are what it takes. A node that
	// refuses it for want of room (node-full, node-draining: said in a header, as E2B's error
	// body has no field for it) made nothing, and the create is placed again, as bothy's is.
	want, candidates, noRoom := e2bPlacement(nodes, cr.TemplateID, volumesOn)
	// And one that binds secrets on a node that holds them (secrets.go).
	candidates, secretsNoRoom := rt.secretCandidates(nodes, candidates, e2bCreateSecrets(body), "")
	want.MemoryMB, want.MilliCPU = rt.cfg.DefaultMemoryMB, rt.cfg.DefaultVCPUs*1000
	refused := map[string]bool{}
	var res *placement.Reservation
	var status int
	var hdr http.Header
	var answer []byte
	for {
		res, err = rt.placer.Place(placementNodes(candidates, refused), want)
		if err != nil && secretsNoRoom != "" {
			e2bError(w, http.StatusServiceUnavailable, secretsNoRoom)
			return
		}
		if err != nil && volumesOn != "" {
			e2bError(w, http.StatusServiceUnavailable, fmt.Sprintf("The sandbox mounts volumes of node %q, which cannot take it now: it is full, cordoned, draining or unhealthy. Kill sandboxes there, or try again later.", volumesOn))
			return
		}
		if err != nil {
			e2bError(w, http.StatusServiceUnavailable, noRoom)
			return
		}
		status, hdr, answer, err = rt.nodeCall(req, nodes[res.Node()], req.Method, req.URL.Path, req.URL.RawQuery, bytes.NewReader(body), rt.nodeAPIKey)
		if err == nil && status == http.StatusServiceUnavailable && hdr.Get(e2b.CodeHeader) != "" {
			res.Release()
			refused[res.Node()] = true
			rt.log.Info("router: a node refused an E2B create for want of room; placing it again", "node", res.Node(), "code", hdr.Get(e2b.CodeHeader))
			continue
		}
		break
	}
	if err != nil {
		res.Release()
		rt.log.Warn("router: an E2B create on a node failed", "node", res.Node(), "err", err)
		e2bError(w, http.StatusBadGateway, "The node chosen for the sandbox did not answer; try again.")
		return
	}
	if status/100 != 2 {
		res.Release()
	} else {
		res.Done(time.Now())
		var made struct {
			SandboxID string `json:"sandboxID"`
		}
		if json.Unmarshal(answer, &made) == nil && made.SandboxID != "" {
			rt.remember(made.SandboxID, res.Node())
		}
	}
	copyHeader(w.Header(), hdr)
	w.WriteHeader(status)
	_, _ = w.Write(answer) //nolint:gosec // G705: the node's own answer, passed on as a single node gives it
}

// e2bPlacement is what an E2B create whose templateID is name asks of placement, the nodes
// it may go to and what to answer when none of them has room. A node takes the templateID
// for one of its templates, else for an image (e2b.Handler.createRequest); so does the
// router: a name some node lists among its templates' generations is a template, and the
// holder of its current generation is preferred (a clone is made from a local copy); else
// a name that nodes list among their images is an image, and only those nodes may take the
// create, as bothy's create naming that image (createCandidates): another node would refuse
// it, not having the image. A name no node lists at all is left to the node placement
// chooses, which answers for it. Volumes' node comes before either, as in bothy's create.
func e2bPlacement(nodes map[string]*nodeView, name, volumesOn string) (placement.Request, map[string]*nodeView, string) {
	if volumesOn == "" && !namesTemplate(nodes, name) {
		if holders := imageHolders(nodes, name); holders != nil {
			return placement.Request{Image: name}, holders, fmt.Sprintf("No node that holds the image %q can take this sandbox now: each is full, cordoned, draining, unhealthy or lost. Pull the image again through the router (it pulls on every live node), kill sandboxes, or try again later.", name)
		}
	}
	return placement.Request{Template: name}, onlyNode(nodes, volumesOn), "No node of the cluster can take this sandbox now: every node is full, cordoned, draining, unhealthy or lost. Kill sandboxes or add a node."
}

// namesTemplate reports whether some node lists a generation of the template name.
func namesTemplate(nodes map[string]*nodeView, name string) bool {
	if name == "" {
		return false
	}
	for _, n := range nodes {
		for _, g := range n.obj.Status.Generations {
			if g.Template == name {
				return true
			}
		}
	}
	return false
}

// e2bList merges every live node's list. A node lists in id order and its next token is the
// page's last id (as bothy's own list), so the same query to every node, merged by id and cut
// at the limit, is the page one node holding every sandbox would give. E2B has no state for
// a sandbox whose node is lost: such sandboxes are left out here (bothy's list shows them).
func (rt *Router) e2bList(w http.ResponseWriter, req *http.Request) {
	limit := 100
	if v := req.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			e2bError(w, http.StatusBadRequest, "The limit must be from 1 to 1000.")
			return
		}
		limit = n
	}
	nodes, ok := rt.readNodes(w, req, planeE2B)
	if !ok {
		return
	}
	var items []listItem
	more := false
	for name, n := range nodes {
		if !n.live {
			continue
		}
		status, hdr, body, err := rt.nodeCall(req, n, http.MethodGet, req.URL.Path, req.URL.RawQuery, nil, rt.nodeAPIKey)
		if err == nil && status/100 == 4 {
			copyHeader(w.Header(), hdr)
			w.WriteHeader(status)
			_, _ = w.Write(body)
			return
		}
		var page []json.RawMessage
		if err != nil || status != http.StatusOK || json.Unmarshal(body, &page) != nil {
			rt.log.Warn("router: a node's E2B list failed", "node", name, "status", status, "err", err)
			e2bError(w, http.StatusBadGateway, fmt.Sprintf("Node %q did not answer the list; try again.", name))
			return
		}
		for _, raw := range page {
			var head struct {
				SandboxID string `json:"sandboxID"`
			}
			if json.Unmarshal(raw, &head) == nil {
				items = append(items, listItem{id: head.SandboxID, raw: raw})
			}
		}
		more = more || hdr.Get("X-Next-Token") != ""
	}
	sort.Slice(items, func(i, j int) bool { return items[i].id < items[j].id })
	if len(items) > limit {
		items, more = items[:limit], true
	}
	out := make([]json.RawMessage, 0, len(items))
	for _, it := range items {
		out = append(out, it.raw)
	}
	if more && len(items) > 0 {
		w.Header().Set("X-Next-Token", items[len(items)-1].id)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// e2bMetrics asks every live node for the metrics of the sandboxes named and merges the
// answers: each node answers for the sandboxes it holds.
func (rt *Router) e2bMetrics(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeE2B)
	if !ok {
		return
	}
	merged := map[string]json.RawMessage{}
	for name, n := range nodes {
		if !n.live {
			continue
		}
		status, hdr, body, err := rt.nodeCall(req, n, http.MethodGet, req.URL.Path, req.URL.RawQuery, nil, rt.nodeAPIKey)
		if err == nil && status != http.StatusOK {
			copyHeader(w.Header(), hdr) // the query is wrong, or the nodes sample nothing: as a node says
			w.WriteHeader(status)
			_, _ = w.Write(body)
			return
		}
		var page struct {
			Sandboxes map[string]json.RawMessage `json:"sandboxes"`
		}
		if err != nil || json.Unmarshal(body, &page) != nil {
			rt.log.Warn("router: a node's E2B metrics failed", "node", name, "err", err)
			e2bError(w, http.StatusBadGateway, fmt.Sprintf("Node %q did not answer; try again.", name))
			return
		}
		for id, m := range page.Sandboxes {
			merged[id] = m
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"sandboxes": merged})
}

// nodeCall sends one bounded call to node n with the credentials auth sets, and reads the
// whole answer (at most 64 MiB).
func (rt *Router) nodeCall(req *http.Request, n *nodeView, method, path, rawQuery string, body io.Reader, auth func(http.Header)) (int, http.Header, []byte, error) {
	u, err := nodeAddress(n)
	if err != nil {
		return 0, nil, nil, err
	}
	u.Path, u.RawQuery = path, rawQuery
	out, err := http.NewRequestWithContext(req.Context(), method, u.String(), body) //nolint:gosec // G704: a node's published address
	if err != nil {
		return 0, nil, nil, err
	}
	for _, h := range []string{"Content-Type", "Accept", "X-Request-Id"} {
		if v := req.Header.Get(h); v != "" {
			out.Header.Set(h, v)
		}
	}
	// The client's Idempotency-Key goes with the client's own call, so that a call sent to
	// every node (a pull, a template's create) is deduplicated by each node on its own; a
	// call the router makes of its own (a read, an undo, a create on behalf of a rotate) is
	// another request, which must not spend the key.
	if v := req.Header.Get("Idempotency-Key"); v != "" && method == req.Method && path == req.URL.Path {
		out.Header.Set("Idempotency-Key", v)
	}
	auth(out.Header)
	resp, err := rt.http.Do(out) //nolint:gosec // G704: as above
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, answer, nil
}

// copyHeader copies a node's answer's headers, but the ones the body's own length sets.
func copyHeader(dst, src http.Header) {
	for k, v := range src {
		if k == "Content-Length" {
			continue
		}
		dst[k] = v
	}
}

// e2bVolumes routes E2B's volume control plane (/volumes), as bothy's volumes are routed
// (volumes.go): a create placed, a volume's calls to its node, the list merged. A volume's id
// is its name.
func (rt *Router) e2bVolumes(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeE2B)
	if !ok {
		return
	}
	id, _ := strings.CutPrefix(req.URL.Path, "/volumes/")
	switch {
	case req.URL.Path == "/volumes" && req.Method == http.MethodPost:
		rt.createVolume(w, req, planeE2B, nodes)
	case req.URL.Path == "/volumes" && req.Method == http.MethodGet:
		rt.e2bListVolumes(w, req, nodes)
	default:
		rt.proxyVolume(w, req, planeE2B, nodes, id)
	}
}

// e2bListVolumes merges every live node's E2B volume list by name (E2B's list is an array).
func (rt *Router) e2bListVolumes(w http.ResponseWriter, req *http.Request, nodes map[string]*nodeView) {
	type entry struct {
		name string
		raw  json.RawMessage
	}
	var all []entry
	for _, name := range liveNames(nodes) {
		status, _, body, err := rt.nodeCall(req, nodes[name], http.MethodGet, "/volumes", "", nil, rt.nodeAPIKey)
		var page []json.RawMessage
		if err != nil || status != http.StatusOK || json.Unmarshal(body, &page) != nil {
			rt.log.Warn("router: a node's E2B volume list failed", "node", name, "status", status, "err", err)
			e2bError(w, http.StatusBadGateway, fmt.Sprintf("Node %q did not answer the volume list; try again.", name))
			return
		}
		for _, raw := range page {
			var head struct{ Name string }
			if json.Unmarshal(raw, &head) == nil && head.Name != "" {
				all = append(all, entry{head.Name, raw})
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].name < all[j].name })
	out := make([]json.RawMessage, 0, len(all))
	for _, e := range all {
		out = append(out, e.raw)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// serveVolumeContent routes E2B's volume content API (/volumecontent/{id}/...) to the
// volume's node. The call carries the volume's own token, which the node made from the token
// the router holds too: the router checks it before it looks the volume up, so a caller
// without it learns nothing of the cluster, and passes it on unchanged.
func (rt *Router) serveVolumeContent(w http.ResponseWriter, req *http.Request, id string) {
	got, _ := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if want := e2b.VolumeToken(rt.cfg.NodeToken, id); want != "" && !hmac.Equal([]byte(got), []byte(want)) {
		e2bError(w, http.StatusUnauthorized, "Invalid volume token: connect to the volume (Volume.connect) for its token.")
		return
	}
	nodes, ok := rt.readNodes(w, req, planeE2B)
	if !ok {
		return
	}
	rt.proxyVolume(w, req, planeEnvd, nodes, id)
}
