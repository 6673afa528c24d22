package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/bothy/bothy/e2b"
)

// E2B's snapshots through the router (docs/cluster.md, "E2B's API through the router"). On a
// node an E2B snapshot is a template (snap-<sandbox>-<name>) with one generation, captured
// from the sandbox on that sandbox's node (e2b/snapshots.go). So the router routes it as it
// routes templates (templates.go):
//
//   - a snapshot's create (POST /sandboxes/{id}/snapshots) goes to the sandbox's node, like
//     any call on a sandbox, and the router remembers the new generation as that node's for
//     placement, as it does for a capture: a create from the snapshot sent at once is placed
//     beside it, before the node's BothyNode lists it;
//   - the list (GET /snapshots) is every live node's, merged by id;
//   - a delete (DELETE /templates/{id}, E2B's SDKs' deleteSnapshot) goes to every live node,
//     a node that does not hold it answering 404, which does not count, as a template's
//     delete does;
//   - a create from a snapshot (POST /sandboxes with the snapshot's id as templateID) is
//     placed as a create from a template: among the nodes that hold its current generation
//     first (e2bCreate).

// e2bSnapshot sends a snapshot's create to sandbox id's node and, when the node made it,
// remembers its generation there for placement.
func (rt *Router) e2bSnapshot(w http.ResponseWriter, req *http.Request, id string) {
	seen := &captureAnswer{ResponseWriter: w}
	rt.proxyTo(seen, req, id, planeE2B)
	var made struct {
		SnapshotID string `json:"snapshotID"`
	}
	if seen.status != http.StatusCreated || json.Unmarshal(seen.body.Bytes(), &made) != nil || made.SnapshotID == "" || strings.Contains(made.SnapshotID, "/") {
		return
	}
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		return
	}
	name, err := rt.locate(req.Context(), id, nodes)
	if err != nil || nodes[name] == nil {
		return
	}
	// E2B's answer names the snapshot, not its generation: the node's template record does.
	// The read carries none of the create's Idempotency-Key, which is the create's alone.
	status, _, body, err := rt.nodeCall(req, nodes[name], http.MethodGet, "/v1/templates/"+made.SnapshotID, "", nil, rt.nodeAuth)
	var t struct {
		Latest string `json:"latest"`
	}
	if err != nil || status != http.StatusOK || json.Unmarshal(body, &t) != nil || t.Latest == "" {
		rt.log.Warn("router: reading a new snapshot's generation", "node", name, "snapshot", made.SnapshotID, "status", status, "err", err)
		return
	}
	rt.rememberCapture(made.SnapshotID, t.Latest, name)
}

// e2bListSnapshots merges every live node's GET /snapshots (the client's query, sandboxID
// and name, sent to each): one entry a snapshot id, in id order. A live node that fails the
// list fails it, as for the sandboxes.
func (rt *Router) e2bListSnapshots(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeE2B)
	if !ok {
		return
	}
	byID := map[string]json.RawMessage{}
	for _, a := range rt.callNodes(req, nodes, liveNames(nodes), http.MethodGet, "/snapshots", req.URL.RawQuery, nil, rt.nodeAPIKey) {
		if a.err == nil && a.status/100 == 4 {
			a.pass(w)
			return
		}
		var page []json.RawMessage
		if a.err != nil || a.status != http.StatusOK || json.Unmarshal(a.body, &page) != nil {
			rt.log.Warn("router: a node's E2B snapshot list failed", "node", a.node, "status", a.status, "err", a.err)
			e2bError(w, http.StatusBadGateway, fmt.Sprintf("Node %q did not answer the snapshot list; try again.", a.node))
			return
		}
		for _, raw := range page {
			var head struct {
				SnapshotID string `json:"snapshotID"`
			}
			if json.Unmarshal(raw, &head) == nil && head.SnapshotID != "" {
				if _, had := byID[head.SnapshotID]; !had {
					byID[head.SnapshotID] = raw
				}
			}
		}
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]json.RawMessage, 0, len(ids))
	for _, id := range ids {
		out = append(out, byID[id])
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// e2bDeleteTemplate sends E2B's template delete (a snapshot's) to every live node. A node
// that does not hold it answers 404, which does not count. The answer: a node's refusal,
// the other nodes' deletes standing (repeat the delete); else a node's success; else the 404.
// A node that does not answer fails the call (502), the others' deletes standing.
func (rt *Router) e2bDeleteTemplate(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeE2B)
	if !ok {
		return
	}
	names := liveNames(nodes)
	if len(names) == 0 {
		e2bError(w, http.StatusServiceUnavailable, "No node of the cluster is live; try again once one is.")
		return
	}
	var refused, done, notFound *nodeAnswer
	answers := rt.callNodes(req, nodes, names, http.MethodDelete, req.URL.Path, "", nil, rt.nodeAPIKey)
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err != nil:
			rt.log.Warn("router: a node did not answer an E2B template delete", "node", a.node, "err", a.err)
			e2bError(w, http.StatusBadGateway, fmt.Sprintf("Node %q did not answer the delete; the other nodes' deletes stand. Repeat the delete once it answers.", a.node))
			return
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
	for _, a := range []*nodeAnswer{refused, done, notFound} {
		if a != nil {
			a.pass(w)
			return
		}
	}
}

// snapshotOf is the sandbox whose snapshot the E2B call creates (POST
// /sandboxes/{id}/snapshots); "" for any other call.
func snapshotOf(req *http.Request) string {
	rest, ok := strings.CutPrefix(req.URL.Path, "/sandboxes/")
	if !ok || req.Method != http.MethodPost || req.Header.Get(e2b.SandboxHeader) != "" {
		return ""
	}
	if id, tail, _ := strings.Cut(rest, "/"); id != "" && tail == "snapshots" {
		return id
	}
	return ""
}
