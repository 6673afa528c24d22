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
	"sync"
	"time"

	"github.com/bothy/bothy/cluster/placement"
)

// Images and templates through the router (docs/cluster.md, "Images and templates"). Both are
// held by each node on its own: an image is pulled into one node's store, a template's
// generations are captured from one node's sandbox. An image is the same image wherever a
// name names it, so the router makes it the cluster's: a pull goes to every live node, a
// delete to every live node, a read merges the nodes' records, and a create that names an
// image is placed among the nodes that hold it. An import (a stream of up to the file limit)
// goes to one node, streamed through: the node that holds the name, else the one placement
// chooses; templates are routed in templates.go.

// notRouted answers a call under /v1/images that no route of the router's takes: the
// contract has no such call, so the router says so rather than guess a node.
func notRouted(w http.ResponseWriter, req *http.Request) {
	problem(w, http.StatusNotImplemented, "not-implemented", fmt.Sprintf(
		"The cluster router does not serve %s %s; see /openapi.yaml for the calls on images.", req.Method, req.URL.Path))
}

// listImages merges every live node's page of GET /v1/images (the same limit and cursor
// to each): one entry a name, the node's that has it ready if any does (else the first
// node's by name), in name order as a node lists, cut at the limit (writePage). A live node
// that fails the list fails it, as for the sandboxes.
func (rt *Router) listImages(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	type image struct {
		state string
		raw   json.RawMessage
	}
	items, more, ok := rt.livePages(w, req, nodes, "image list")
	if !ok {
		return
	}
	byName := map[string]*image{}
	for _, raw := range items {
		var head struct{ Name, State string }
		if json.Unmarshal(raw, &head) != nil || head.Name == "" {
			continue
		}
		if had, ok := byName[head.Name]; !ok || (had.state != "ready" && head.State == "ready") {
			byName[head.Name] = &image{state: head.State, raw: raw}
		}
	}
	keys := make([]string, 0, len(byName))
	for k := range byName {
		keys = append(keys, k)
	}
	writePage(w, keys, listLimit(req), more, func(k string) json.RawMessage { return byName[k].raw })
}

// serveImages routes /v1/images and below it: the list merged, a pull to every live node,
// a read merged, a delete to every live node, an import to one node.
func (rt *Router) serveImages(w http.ResponseWriter, req *http.Request) {
	name, hasName := strings.CutPrefix(req.URL.Path, "/v1/images/")
	switch {
	case req.URL.Path == "/v1/images" && req.Method == http.MethodGet:
		rt.listImages(w, req)
	case req.URL.Path == "/v1/images" && req.Method == http.MethodPost:
		rt.pullImage(w, req)
	case hasName && name != "" && !strings.Contains(name, "/") && req.Method == http.MethodGet:
		rt.getImage(w, req)
	case hasName && name != "" && !strings.Contains(name, "/") && req.Method == http.MethodDelete:
		rt.deleteImage(w, req)
	case hasName && name != "" && !strings.Contains(name, "/") && req.Method == http.MethodPut:
		rt.importImage(w, req, name)
	default:
		notRouted(w, req)
	}
}

// nodeAnswer is one node's answer to a call the router sent to every live node.
type nodeAnswer struct {
	node   string
	status int
	header http.Header
	body   []byte
	err    error
}

// fanOut bounds the calls one fan-out (callNodes) has in flight at once.
const fanOut = 8

// toEveryLiveNode sends the call req is, with body, to every live node (callNodes).
func (rt *Router) toEveryLiveNode(w http.ResponseWriter, req *http.Request, body []byte) ([]nodeAnswer, bool) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return nil, false
	}
	names := liveNames(nodes)
	if len(names) == 0 {
		problem(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live; try again once one is.")
		return nil, false
	}
	return rt.callNodes(req, nodes, names, req.Method, req.URL.Path, req.URL.RawQuery, body, rt.nodeAuth), true
}

// callNodes sends one call, with body and the credentials auth sets, to each node named, at
// most fanOut at once, and answers their answers in the order of names: a read or a write
// waits for the slowest node, not for the sum of them, and the callers' "first refusal" is
// the same whatever the timing.
func (rt *Router) callNodes(req *http.Request, nodes map[string]*nodeView, names []string, method, path, rawQuery string, body []byte, auth func(http.Header)) []nodeAnswer {
	answers := make([]nodeAnswer, len(names))
	var wg sync.WaitGroup
	slots := make(chan struct{}, fanOut)
	for i, name := range names {
		var r io.Reader
		if body != nil {
			r = bytes.NewReader(body)
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			status, hdr, b, err := rt.nodeCall(req, nodes[name], method, path, rawQuery, r, auth)
			answers[i] = nodeAnswer{node: name, status: status, header: hdr, body: b, err: err}
		})
	}
	wg.Wait()
	return answers
}

// pass writes a node's answer as the router's.
func (a nodeAnswer) pass(w http.ResponseWriter) {
	copyHeader(w.Header(), a.header)
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body) //nolint:gosec // G705: the node's own answer, passed on
}

// code is the node's problem code (bothy's API); "" for none.
func (a nodeAnswer) code() string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

// pullImage starts the pull on every live node: an image is the cluster's, and a sandbox of
// it may be placed on any node that holds it. The answer is the first node's that took the
// pull (each node answers at once, with the image pulling); when none took it, the first
// refusal, which is every node's for a request that is wrong. A node that refused while
// others took it is logged, and shows in the image's read (its record, or its absence).
func (rt *Router) pullImage(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, rt.cfg.MaxCreateBytes+1))
	if err != nil || int64(len(body)) > rt.cfg.MaxCreateBytes {
		problem(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The pull request is larger than %d bytes or could not be read; send a smaller one.", rt.cfg.MaxCreateBytes))
		return
	}
	answers, ok := rt.toEveryLiveNode(w, req, body)
	if !ok {
		return
	}
	var took, refused *nodeAnswer
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err == nil && a.status/100 == 2:
			if took == nil {
				took = a
			}
		case a.err == nil && refused == nil:
			refused = a
			fallthrough
		default:
			rt.log.Warn("router: a node did not take an image's pull", "node", a.node, "status", a.status, "err", a.err)
		}
	}
	switch {
	case took != nil:
		took.pass(w)
	case refused != nil:
		refused.pass(w)
	default:
		problem(w, http.StatusBadGateway, "unavailable", "No node answered the pull; try again.")
	}
}

// imageStateRank orders the states of one image's records on the nodes for the merged read:
// the least advanced wins, so that a client waiting for ready waits for every node.
var imageStateRank = map[string]int{"failed": 0, "pulling": 1, "ready": 2}

// getImage reads the image on every live node: the record of the node where it is least
// advanced (failed, then pulling, then ready), so ready means ready on every node that
// holds it; 404 when no live node holds it. A node that does not hold the name (it joined
// after the pull, or refused it) does not count: creates are placed among the holders.
func (rt *Router) getImage(w http.ResponseWriter, req *http.Request) {
	answers, ok := rt.toEveryLiveNode(w, req, nil)
	if !ok {
		return
	}
	var pick, notFound *nodeAnswer
	pickRank := 3
	for i := range answers {
		a := &answers[i]
		if a.err != nil || a.status/100 == 5 {
			rt.log.Warn("router: a node's image read failed", "node", a.node, "status", a.status, "err", a.err)
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the image's read; try again.", a.node))
			return
		}
		if a.status != http.StatusOK {
			if notFound == nil {
				notFound = a
			}
			continue
		}
		var head struct{ State string }
		_ = json.Unmarshal(a.body, &head)
		if r, known := imageStateRank[head.State]; known && r < pickRank {
			pick, pickRank = a, r
		}
	}
	switch {
	case pick != nil:
		pick.pass(w)
	case notFound != nil:
		notFound.pass(w)
	default:
		problem(w, http.StatusBadGateway, "unavailable", "No node answered the image's read; try again.")
	}
}

// deleteImage deletes the image on every live node that holds it: 204 when each either
// deleted it or does not hold it (404), and at least one deleted it; else the first refusal
// (image-in-use, naming that node's users), the others' deletes standing: repeat the delete
// once those users are gone.
func (rt *Router) deleteImage(w http.ResponseWriter, req *http.Request) {
	answers, ok := rt.toEveryLiveNode(w, req, nil)
	if !ok {
		return
	}
	passDelete(w, answers, func(a *nodeAnswer) bool {
		if a.err == nil {
			return false
		}
		problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the image's delete; try again.", a.node))
		return true
	})
}

// passDelete answers a delete sent to every live node from their answers, in the nodes'
// order: failed(a) first, which answers and reports true for a node whose answer counts as
// none; then a node's refusal (anything but 204 or 404), passed on at once; else a
// deletion (204); else the first 404, when no node held it.
func passDelete(w http.ResponseWriter, answers []nodeAnswer, failed func(a *nodeAnswer) bool) {
	var deleted, notFound *nodeAnswer
	for i := range answers {
		a := &answers[i]
		switch {
		case failed(a):
			return
		case a.status == http.StatusNoContent:
			deleted = a
		case a.status == http.StatusNotFound:
			if notFound == nil {
				notFound = a
			}
		default:
			a.pass(w)
			return
		}
	}
	if deleted != nil {
		deleted.pass(w)
		return
	}
	notFound.pass(w)
}

// imageHolders are the nodes whose status lists image name ready; nil for no image, or one
// no node lists (the node placement chooses answers for it, as one node would).
func imageHolders(nodes map[string]*nodeView, image string) map[string]*nodeView {
	if image == "" {
		return nil
	}
	var out map[string]*nodeView
	for name, n := range nodes {
		for _, im := range n.obj.Status.Images {
			if im == image {
				if out == nil {
					out = map[string]*nodeView{}
				}
				out[name] = n
				break
			}
		}
	}
	return out
}

// livePages reads every live node's page of req's list (its path and query) at once
// (callNodes) and answers their items, node after node in name order, and whether some node
// has more after its page (a next cursor): false, with the call answered, when a node
// refuses the query (its 4xx passed on, as one node gives it, since every node would refuse
// it alike) or does not answer (502).
func (rt *Router) livePages(w http.ResponseWriter, req *http.Request, nodes map[string]*nodeView, what string) ([]json.RawMessage, bool, bool) {
	var items []json.RawMessage
	more := false
	for _, a := range rt.callNodes(req, nodes, liveNames(nodes), http.MethodGet, req.URL.Path, req.URL.RawQuery, nil, rt.nodeAuth) {
		if a.err == nil && a.status/100 == 4 {
			a.pass(w)
			return nil, false, false
		}
		var page struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor string            `json:"next_cursor"`
		}
		if a.err != nil || a.status != http.StatusOK || json.Unmarshal(a.body, &page) != nil {
			rt.log.Warn("router: a node's list failed", "node", a.node, "list", what, "status", a.status, "err", a.err)
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the %s; try again.", a.node, what))
			return nil, false, false
		}
		items = append(items, page.Items...)
		more = more || page.NextCursor != ""
	}
	return items, more, true
}

// listLimit is the page size of a list asked of the router: its limit, 100 by default as on
// a node. A limit that is no number or out of range is left to the nodes to refuse (400),
// as one node refuses it.
func listLimit(req *http.Request) int {
	if n, err := strconv.Atoi(req.URL.Query().Get("limit")); err == nil && n > 0 {
		return n
	}
	return 100
}

// writePage answers a merged list: the keys (every node's page merged, one entry a key)
// sorted, cut at limit, each key's item from item; the next cursor is the page's last key
// when the cut dropped keys or some node had more after its page. Each node's page is its
// first limit keys after the cursor, so the merged first limit keys are exactly the page one
// node holding every item would give, and its last key is where the next page starts.
func writePage(w http.ResponseWriter, keys []string, limit int, more bool, item func(string) json.RawMessage) {
	sort.Strings(keys)
	if len(keys) > limit {
		keys, more = keys[:limit], true
	}
	out := struct {
		Items      []json.RawMessage `json:"items"`
		NextCursor string            `json:"next_cursor,omitempty"`
	}{Items: make([]json.RawMessage, 0, len(keys))}
	for _, k := range keys {
		out.Items = append(out.Items, item(k))
	}
	if more && len(keys) > 0 {
		out.NextCursor = keys[len(keys)-1]
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// importImage streams an import (PUT /v1/images/{name}, an archive of up to the node's file
// limit) to one node, never holding it: the router is stateless, and a create that names the
// image is placed among the nodes that hold it, so one node is enough. The node is the live
// node that holds the name already (an import replaces it there, as on one node), else the
// one placement chooses for a sandbox (the most room), where sandboxes of the image will run.
// A name several live nodes hold (pulled through the router) is refused: replacing it on one
// of them would give the name two meanings in the cluster; delete it through the router
// first. The node checks the archive and bounds its size (413), as it does for any client.
func (rt *Router) importImage(w http.ResponseWriter, req *http.Request, image string) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	names := liveNames(nodes)
	if len(names) == 0 {
		problem(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live; try again once one is.")
		return
	}
	// The probe is a read: it carries neither the import's body nor its Idempotency-Key.
	var holders []string
	for _, name := range names {
		status, hdr, body, err := rt.nodeCall(req, nodes[name], http.MethodGet, "/v1/images/"+image, "", nil, rt.nodeAuth)
		switch {
		case err != nil || status/100 == 5:
			rt.log.Warn("router: a node's image read failed before an import", "node", name, "status", status, "err", err)
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer whether it holds the image %q; try the import again.", name, image))
			return
		case status == http.StatusOK:
			holders = append(holders, name)
		case status != http.StatusNotFound:
			// A name that is no image's name (400) is every node's to refuse.
			nodeAnswer{node: name, status: status, header: hdr, body: body}.pass(w)
			return
		}
	}
	var target string
	switch len(holders) {
	case 0:
		res, err := rt.placer.Place(placementNodes(nodes, nil), placement.Request{Image: image})
		if err != nil {
			problem(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster can take an image now: every node is full, cordoned, draining, unhealthy or lost. Try again later, or add a node.")
			return
		}
		// The import reserves no sandbox's room: the choice is all it takes from placement.
		res.Release()
		target = res.Node()
	case 1:
		target = holders[0]
	default:
		problem(w, http.StatusConflict, "already-provisioned", fmt.Sprintf(
			"The image %q is held by the nodes %s: an import through the router goes to one node and would leave the others holding another image of that name. Delete it through the router first (DELETE /v1/images/%s), then import it again.",
			image, strings.Join(holders, ", "), image))
		return
	}
	seen := &captureAnswer{ResponseWriter: w}
	rt.proxyToNode(seen, req, target, nodes[target], planeREST, "image "+strconv.Quote(image))
	if seen.status == http.StatusCreated {
		rt.rememberImport(image, target)
	}
}

// rememberImport keeps that node imported image, until its BothyNode lists it (within a
// second): a create of the image sent at once is placed there, not on a node without it.
func (rt *Router) rememberImport(image, node string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	now := time.Now()
	if rt.imports == nil {
		rt.imports = map[string]recentPlacement{}
	}
	for k, v := range rt.imports {
		if now.Sub(v.at) > recentFor {
			delete(rt.imports, k)
		}
	}
	rt.imports[image] = recentPlacement{node: node, at: now}
}

// withRecentImport adds image to the published images of the node this router imported it
// to lately, for createCandidates; nodes are the router's own copies.
func (rt *Router) withRecentImport(nodes map[string]*nodeView, image string) {
	if image == "" {
		return
	}
	rt.mu.Lock()
	p, ok := rt.imports[image]
	rt.mu.Unlock()
	n := nodes[p.node]
	if !ok || time.Since(p.at) > recentFor || n == nil || slices.Contains(n.obj.Status.Images, image) {
		return
	}
	n.obj.Status.Images = append(n.obj.Status.Images, image)
}
