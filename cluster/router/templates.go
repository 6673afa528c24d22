package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// Templates through the router (docs/cluster.md, "Templates"). A template's generations are
// captured on one node, from its sandbox, and reach the others through the template
// registry (--template-registry): a node pulls a generation on its first clone, and a
// tombstone or retirement made on one node is recorded there for all. So the router makes a
// template the cluster's by sending each call where it belongs:
//
//   - a capture to the node of the sandbox it names (that node's files are the generation);
//   - a template's create, delete, and a generation's tombstone and retirement to every live
//     node, each node that does not hold it answering 404, which does not count;
//   - reads to every live node, merged: the list of templates and of generations by name or
//     id (the nodes' pages are in key order, so one query to all, merged and cut at the
//     limit, is the page one node holding them all would give), a record held by several
//     nodes answered once, its leases counted over all of them.

// serveTemplates routes /v1/templates and everything below it.
func (rt *Router) serveTemplates(w http.ResponseWriter, req *http.Request) {
	rest := strings.TrimPrefix(req.URL.Path, "/v1/templates")
	var parts []string
	if rest != "" {
		parts = strings.Split(strings.TrimPrefix(rest, "/"), "/")
	}
	switch {
	case rest == "" && req.Method == http.MethodGet:
		rt.mergedList(w, req, "name", pickTemplate)
	case rest == "" && req.Method == http.MethodPost:
		rt.toEveryHolder(w, req, true)
	case len(parts) == 1 && req.Method == http.MethodGet:
		rt.mergedRead(w, req, pickTemplate)
	case len(parts) == 1 && req.Method == http.MethodDelete:
		rt.toEveryHolder(w, req, false)
	case len(parts) >= 2 && parts[1] == "generations":
		rt.serveGenerations(w, req, parts)
	default:
		rt.anyNodeAnswers(w, req)
	}
}

// serveGenerations routes /v1/templates/{name}/generations and everything below it; parts
// are the path's segments after /v1/templates.
func (rt *Router) serveGenerations(w http.ResponseWriter, req *http.Request, parts []string) {
	get, post := req.Method == http.MethodGet, req.Method == http.MethodPost
	switch {
	case len(parts) == 2 && post:
		rt.capture(w, req, parts[0])
	case len(parts) == 2 && get:
		rt.mergedList(w, req, "id", pickGeneration)
	case len(parts) == 3 && get:
		rt.mergedRead(w, req, pickGeneration)
	case len(parts) == 3 && req.Method == http.MethodDelete,
		len(parts) == 4 && parts[3] == "tombstone" && post:
		rt.toEveryHolder(w, req, false)
	case len(parts) == 4 && parts[3] == "leases" && get:
		rt.mergedLeases(w, req)
	default:
		rt.anyNodeAnswers(w, req)
	}
}

// capture sends a capture to the node that holds the sandbox it names. A node that joined
// after the template was made through the router does not hold it, and would answer
// template-not-found: when another live node holds the template, the router makes it on the
// sandbox's node first (an empty template, as the create made it on the others).
func (rt *Router) capture(w http.ResponseWriter, req *http.Request, template string) {
	body, err := io.ReadAll(io.LimitReader(req.Body, rt.cfg.MaxCreateBytes+1))
	if err != nil || int64(len(body)) > rt.cfg.MaxCreateBytes {
		problem(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The capture request is larger than %d bytes or could not be read; send a smaller one.", rt.cfg.MaxCreateBytes))
		return
	}
	var cr struct {
		Sandbox string `json:"sandbox"`
	}
	_ = json.Unmarshal(body, &cr) // a body that does not parse is the node's to refuse
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	name := ""
	if cr.Sandbox != "" && !strings.Contains(cr.Sandbox, "/") {
		if name, err = rt.locate(req.Context(), cr.Sandbox, nodes); err != nil {
			problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's sandboxes from the API server; try again shortly.")
			return
		}
	}
	switch n := nodes[name]; {
	case name == "":
		// No node holds the sandbox (or the body names none): a live node answers as one
		// node would (404 sandbox-not-found, 400).
		if name = anyLive(nodes); name == "" {
			problem(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live; try again once one is.")
			return
		}
	case n == nil || !n.live:
		w.Header().Set("Retry-After", "5")
		problem(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf("The sandbox %q is on node %q, whose lease has lapsed: the node is down or cut off. Capture it once the node is back; try again later.", cr.Sandbox, name))
		return
	default:
		rt.ensureTemplate(req, nodes, name, template)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	seen := &captureAnswer{ResponseWriter: w}
	rt.proxyToNode(seen, req, name, nodes[name], planeREST, "template "+strconv.Quote(template))
	var g struct {
		ID string `json:"id"`
	}
	if seen.status == http.StatusCreated && json.Unmarshal(seen.body.Bytes(), &g) == nil && g.ID != "" {
		rt.rememberCapture(template, g.ID, name)
	}
}

// captureAnswer passes a node's answer to a capture through, keeping its status and the
// start of its body (a generation's record is small) for the router to read.
type captureAnswer struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (a *captureAnswer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
	a.ResponseWriter.WriteHeader(status)
}

func (a *captureAnswer) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	if room := 64<<10 - a.body.Len(); room > 0 {
		a.body.Write(b[:min(len(b), room)])
	}
	return a.ResponseWriter.Write(b)
}

// Unwrap keeps the proxy's flushes and full duplex reaching the client's connection.
func (a *captureAnswer) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// recentCapture is a generation this router captured lately, and its node.
type recentCapture struct {
	gen, node string
	at        time.Time
}

// rememberCapture keeps that node captured gen of template, until its BothyNode lists it:
// a node rewrites its status within a second of a capture, and a clone sent at once (a
// script's next line) must be placed where the generation is — on a node without a template
// registry no other node can clone it.
func (rt *Router) rememberCapture(template, gen, node string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	now := time.Now()
	for k, c := range rt.captures {
		if now.Sub(c.at) > recentFor {
			delete(rt.captures, k)
		}
	}
	if c, ok := rt.captures[template]; !ok || compareKeys(gen, c.gen) >= 0 {
		rt.captures[template] = recentCapture{gen: gen, node: node, at: now}
	}
}

// withRecentCapture adds to its node's published generations the generation of template this
// router captured lately, for placement's locality rule; nodes are the router's own copies.
func (rt *Router) withRecentCapture(nodes map[string]*nodeView, template string) {
	if template == "" {
		return
	}
	rt.mu.Lock()
	c, ok := rt.captures[template]
	rt.mu.Unlock()
	n := nodes[c.node]
	if !ok || time.Since(c.at) > recentFor || n == nil {
		return
	}
	g := v1alpha1.Generation{Template: template, Generation: c.gen}
	if !slices.Contains(n.obj.Status.Generations, g) {
		n.obj.Status.Generations = append([]v1alpha1.Generation{g}, n.obj.Status.Generations...)
	}
}

// ensureTemplate makes template on node target when target does not hold it and another live
// node does. Failures are logged only: the capture then answers as the node does. req is
// the capture, whose Idempotency-Key nodeCall sends with no other call.
func (rt *Router) ensureTemplate(req *http.Request, nodes map[string]*nodeView, target, template string) {
	path := "/v1/templates/" + template
	status, _, _, err := rt.nodeCall(req, nodes[target], http.MethodGet, path, "", nil, rt.nodeAuth)
	if err != nil || status != http.StatusNotFound {
		return
	}
	held := false
	for _, name := range liveNames(nodes) {
		if name == target {
			continue
		}
		if s, _, _, err := rt.nodeCall(req, nodes[name], http.MethodGet, path, "", nil, rt.nodeAuth); err == nil && s == http.StatusOK {
			held = true
			break
		}
	}
	if !held {
		return
	}
	body, _ := json.Marshal(map[string]string{"name": template})
	status, _, _, err = rt.nodeCall(req, nodes[target], http.MethodPost, "/v1/templates", "", bytes.NewReader(body), func(h http.Header) {
		rt.nodeAuth(h)
		h.Set("Content-Type", "application/json")
	})
	if err != nil || (status != http.StatusCreated && status != http.StatusConflict) {
		rt.log.Warn("router: making a template on a capture's node failed", "node", target, "template", template, "status", status, "err", err)
	}
}

// toEveryHolder sends a call that changes a template or a generation to every live node. A
// node that does not hold it answers 404, which does not count. The answer: a node's
// refusal (any other error, say 423 generation-leased, or 409 template-exists for a create),
// the other nodes' changes standing; else a 202 (a drain under way on some node); else the
// first node's success; else the 404 (no node holds it). withBody passes the request's body
// (a create's, bounded) to each.
func (rt *Router) toEveryHolder(w http.ResponseWriter, req *http.Request, withBody bool) {
	var body []byte
	if withBody {
		b, err := io.ReadAll(io.LimitReader(req.Body, rt.cfg.MaxCreateBytes+1))
		if err != nil || int64(len(b)) > rt.cfg.MaxCreateBytes {
			problem(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The request is larger than %d bytes or could not be read; send a smaller one.", rt.cfg.MaxCreateBytes))
			return
		}
		body = b
	}
	answers, ok := rt.toEveryLiveNode(w, req, body)
	if !ok {
		return
	}
	var refused, draining, done, notFound *nodeAnswer
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err != nil:
			rt.log.Warn("router: a node did not answer a template call", "node", a.node, "path", req.URL.Path, "err", a.err)
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer; the other nodes' answers stand. Repeat the call once it answers.", a.node))
			return
		case a.status == http.StatusAccepted:
			draining = a
		case a.status/100 == 2:
			if done == nil {
				done = a
			}
		case a.status == http.StatusNotFound:
			if notFound == nil {
				notFound = a
			}
		default:
			if refused == nil {
				refused = a
			}
		}
	}
	for _, a := range []*nodeAnswer{refused, draining, done, notFound} {
		if a != nil {
			a.pass(w)
			return
		}
	}
}

// readAnswers sends a read to every live node and keeps the 200s. It answers the client
// itself, and returns ok false, when a node fails or none holds what is read (then with
// the first node's 404 or refusal).
func (rt *Router) readAnswers(w http.ResponseWriter, req *http.Request) ([]nodeAnswer, bool) {
	answers, ok := rt.toEveryLiveNode(w, req, nil)
	if !ok {
		return nil, false
	}
	var found []nodeAnswer
	var other *nodeAnswer
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err != nil || a.status/100 == 5:
			rt.log.Warn("router: a node's template read failed", "node", a.node, "status", a.status, "err", a.err)
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the read; try again.", a.node))
			return nil, false
		case a.status == http.StatusOK:
			found = append(found, *a)
		case a.status == http.StatusNotFound:
			if other == nil {
				other = a
			}
		default:
			// A wrong request (400) is every node's: pass it on.
			a.pass(w)
			return nil, false
		}
	}
	if len(found) == 0 {
		other.pass(w)
		return nil, false
	}
	return found, true
}

// pick merges the records of one template or generation that several nodes hold.
type pick func(records []json.RawMessage) json.RawMessage

// pickTemplate answers the record of the node that holds the newest generation (latest),
// then the most generations: the origin's, or a copy as far along as it.
func pickTemplate(records []json.RawMessage) json.RawMessage {
	best, bestLatest, bestCount := records[0], "", -1
	for _, raw := range records {
		var t struct {
			Latest      string `json:"latest"`
			Generations int    `json:"generations"`
		}
		_ = json.Unmarshal(raw, &t)
		if c := compareKeys(t.Latest, bestLatest); c > 0 || (c == 0 && t.Generations > bestCount) {
			best, bestLatest, bestCount = raw, t.Latest, t.Generations
		}
	}
	return best
}

// generationStateRank orders a generation's states on the nodes: the most restrictive wins,
// so that a tombstone or a retirement under way on any node shows.
var generationStateRank = map[string]int{"active": 0, "tombstoned": 1, "retiring": 2}

// pickGeneration answers the record of the node where the generation is most restricted
// (retiring, then tombstoned, then active; then the one that shows its push, the origin's),
// with leases counted over every node that holds it: its clones run on all of them.
func pickGeneration(records []json.RawMessage) json.RawMessage {
	var best map[string]json.RawMessage
	bestRank, leases := -1, 0
	for _, raw := range records {
		var g map[string]json.RawMessage
		if json.Unmarshal(raw, &g) != nil {
			continue
		}
		var state string
		var n int
		_ = json.Unmarshal(g["state"], &state)
		_ = json.Unmarshal(g["leases"], &n)
		leases += n
		rank := generationStateRank[state] * 2
		if _, pushed := g["registry"]; pushed {
			rank++
		}
		if rank > bestRank {
			best, bestRank = g, rank
		}
	}
	if best == nil {
		return records[0]
	}
	best["leases"], _ = json.Marshal(leases)
	out, err := json.Marshal(best)
	if err != nil {
		return records[0]
	}
	return out
}

// compareKeys orders generation ids as numbers (g000001 < g1000000), "" before any.
func compareKeys(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

// mergedRead answers one template or generation read on every live node, merged by merge.
func (rt *Router) mergedRead(w http.ResponseWriter, req *http.Request, merge pick) {
	found, ok := rt.readAnswers(w, req)
	if !ok {
		return
	}
	records := make([]json.RawMessage, 0, len(found))
	for _, a := range found {
		records = append(records, a.body)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(merge(records)) //nolint:gosec // G705: the nodes' own records, merged
}

// mergedList answers a list of templates or generations: the same query (cursor, limit) to
// every live node, the pages merged by key, each key's records merged, cut at the limit. A
// node pages in key order (strings.Compare, as here) after the cursor, so this is the page
// one node holding everything would give; the next cursor is the page's last key.
func (rt *Router) mergedList(w http.ResponseWriter, req *http.Request, key string, merge pick) {
	limit := 100
	if v := req.URL.Query().Get("limit"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			limit = n // a wrong limit is the nodes' to refuse
		}
	}
	found, ok := rt.readAnswers(w, req)
	if !ok {
		return
	}
	byKey := map[string][]json.RawMessage{}
	more := false
	for _, a := range found {
		var page struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor string            `json:"next_cursor"`
		}
		if json.Unmarshal(a.body, &page) != nil {
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q answered the list with a body that is no list; try again.", a.node))
			return
		}
		more = more || page.NextCursor != ""
		for _, raw := range page.Items {
			var head map[string]json.RawMessage
			var k string
			if json.Unmarshal(raw, &head) == nil && json.Unmarshal(head[key], &k) == nil && k != "" {
				byKey[k] = append(byKey[k], raw)
			}
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) > limit {
		keys, more = keys[:limit], true
	}
	out := struct {
		Items      []json.RawMessage `json:"items"`
		NextCursor string            `json:"next_cursor,omitempty"`
	}{Items: make([]json.RawMessage, 0, len(keys))}
	for _, k := range keys {
		out.Items = append(out.Items, merge(byKey[k]))
	}
	if more && len(keys) > 0 {
		out.NextCursor = keys[len(keys)-1]
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// mergedLeases answers a generation's leases: every holder's, together (its clones run on
// each node that holds a copy).
func (rt *Router) mergedLeases(w http.ResponseWriter, req *http.Request) {
	found, ok := rt.readAnswers(w, req)
	if !ok {
		return
	}
	out := struct {
		Items []json.RawMessage `json:"items"`
	}{Items: []json.RawMessage{}}
	for _, a := range found {
		var page struct {
			Items []json.RawMessage `json:"items"`
		}
		if json.Unmarshal(a.body, &page) == nil {
			out.Items = append(out.Items, page.Items...)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// anyNodeAnswers sends a call the router does not route to the first live node, which
// answers it as one node would (404 for no such path, 405 for no such method).
func (rt *Router) anyNodeAnswers(w http.ResponseWriter, req *http.Request) {
	nodes, name, ok := rt.firstLive(w, req)
	if !ok {
		return
	}
	rt.proxyToNode(w, req, name, nodes[name], planeREST, req.URL.Path)
}
