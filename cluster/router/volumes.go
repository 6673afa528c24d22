package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/bothy/bothy/cluster/placement"
)

// Volumes through the router (docs/cluster.md, "Volumes"). A volume lives on the node that
// made it — its files are that node's disk — and each node lists all its volumes' names in
// its BothyNode's status (a node holds at most 256, the status's bound), so the router knows
// where every volume is, lost nodes' included, without asking the nodes: a volume's calls go
// to its node, a create of one is placed like a sandbox, and a sandbox that mounts volumes is
// placed on their node.

// volumeKey is a volume's key in the router's recent placements, apart from sandbox ids,
// which share volumes' alphabet.
func volumeKey(name string) string { return "volume:" + name }

// volumeHolder is the node whose status lists volume name, else the one this router placed
// it on lately (a node lists a new volume at its next status write); "" for none.
func (rt *Router) volumeHolder(nodes map[string]*nodeView, name string) string {
	names := make([]string, 0, len(nodes))
	for n := range nodes {
		names = append(names, n)
	}
	sort.Strings(names) // one answer for a name two nodes list (made by two routers at once)
	for _, n := range names {
		for _, v := range nodes[n].obj.Status.Volumes {
			if v == name {
				return n
			}
		}
	}
	return rt.recentNode(volumeKey(name))
}

// serveVolumes routes /v1/volumes and everything below it.
func (rt *Router) serveVolumes(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	rest := strings.TrimPrefix(req.URL.Path, "/v1/volumes")
	switch {
	case rest == "" && req.Method == http.MethodGet:
		rt.listVolumes(w, req, nodes)
	case rest == "" && req.Method == http.MethodPost:
		rt.createVolume(w, req, planeREST, nodes)
	case strings.HasPrefix(rest, "/") && len(rest) > 1:
		name, _, _ := strings.Cut(rest[1:], "/")
		rt.proxyVolume(w, req, planeREST, nodes, name)
	default:
		// What a node answers for it (405, 404), from any live node.
		rt.proxyVolume(w, req, planeREST, nodes, "")
	}
}

// proxyVolume sends a call on volume name to its node: the holder if any, else a live node,
// which answers as a single node does (404 volume-not-found, 400 for a bad name). pl is the
// API the call belongs to: bothy's, E2B's control plane, or E2B's volume content API (whose
// volume token passes through, as the envd plane's access token does).
func (rt *Router) proxyVolume(w http.ResponseWriter, req *http.Request, pl plane, nodes map[string]*nodeView, name string) {
	holder := ""
	if name != "" {
		holder = rt.volumeHolder(nodes, name)
	}
	switch n := nodes[holder]; {
	case holder == "":
		if holder = anyLive(nodes); holder == "" {
			pl.fail(w, http.StatusNotFound, "volume-not-found", fmt.Sprintf("No volume %q is on any node of the cluster; list the volumes to find yours.", name))
			return
		}
	case n == nil || !n.live:
		w.Header().Set("Retry-After", "5")
		pl.fail(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf("The volume %q is on node %q, whose lease has lapsed: the node is down or cut off. Its volumes answer again once it is back; try again later.", name, holder))
		return
	}
	rt.proxyToNode(w, req, holder, nodes[holder], pl, "volume "+strconv.Quote(name))
}

// createVolume places a new volume: on the node that already lists its name (which answers
// volume-exists, as one node would), else on the node placement chooses for a sandbox of no
// size, so that the sandboxes that will mount it find room beside it. bothy's create and
// E2B's both name the volume in "name".
func (rt *Router) createVolume(w http.ResponseWriter, req *http.Request, pl plane, nodes map[string]*nodeView) {
	body, err := io.ReadAll(io.LimitReader(req.Body, rt.cfg.MaxCreateBytes+1))
	if err != nil || int64(len(body)) > rt.cfg.MaxCreateBytes {
		pl.fail(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The create request is larger than %d bytes or could not be read; send a smaller one.", rt.cfg.MaxCreateBytes))
		return
	}
	var vr struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(body, &vr) // a body that does not parse is the node's to refuse
	target := ""
	if holder := rt.volumeHolder(nodes, vr.Name); vr.Name != "" && holder != "" {
		if n := nodes[holder]; n == nil || !n.live {
			w.Header().Set("Retry-After", "5")
			pl.fail(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf("A volume %q is on node %q, whose lease has lapsed; try again once the node is back, or choose another name.", vr.Name, holder))
			return
		}
		target = holder
	} else {
		res, err := rt.placer.Place(placementNodes(nodes, nil), placement.Request{})
		if err != nil {
			pl.fail(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster can take a volume now: every node is full, cordoned, draining, unhealthy or lost.")
			return
		}
		res.Release() // a volume holds no sandbox's slot, memory or CPU
		target = res.Node()
	}
	auth := rt.nodeAuth
	if pl == planeE2B {
		auth = rt.nodeAPIKey
	}
	status, hdr, answer, err := rt.nodeCall(req, nodes[target], req.Method, req.URL.Path, req.URL.RawQuery, bytes.NewReader(body), auth)
	if err != nil {
		rt.log.Warn("router: a volume's create on a node failed", "node", target, "err", err)
		pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q, chosen for the volume, did not answer; try again.", target))
		return
	}
	if status/100 == 2 && vr.Name != "" {
		rt.remember(volumeKey(vr.Name), target)
	}
	nodeAnswer{node: target, status: status, header: hdr, body: answer}.pass(w)
}

// listVolumes merges every live node's page of GET /v1/volumes (the same limit and cursor
// to each), in name order as one node lists them, cut at the limit (writePage). A name is
// one node's volume, so a name two nodes list (made on each directly) is listed once, the
// first node's by node name. A live node that fails the list fails it, as for the
// sandboxes; a lost node's volumes are not listed (the router has their names, not their
// records).
func (rt *Router) listVolumes(w http.ResponseWriter, req *http.Request, nodes map[string]*nodeView) {
	items, more, ok := rt.livePages(w, req, nodes, "volume list")
	if !ok {
		return
	}
	byName := map[string]json.RawMessage{}
	for _, raw := range items {
		var head struct{ Name string }
		if json.Unmarshal(raw, &head) == nil && head.Name != "" && byName[head.Name] == nil {
			byName[head.Name] = raw
		}
	}
	keys := make([]string, 0, len(byName))
	for k := range byName {
		keys = append(keys, k)
	}
	writePage(w, keys, listLimit(req), more, func(k string) json.RawMessage { return byName[k] })
}

// liveNames are the live nodes' names, sorted.
func liveNames(nodes map[string]*nodeView) []string {
	names := make([]string, 0, len(nodes))
	for name, n := range nodes {
		if n.live {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// volumesNode is the one node that holds every volume a create mounts, for placing it there:
// "" when it mounts none or names a volume no node holds (the node placement chooses then
// refuses it, as one node would: 404 volume-not-found). ok is false, with the answer
// written, when the volumes live on different nodes or on a lost one.
func (rt *Router) volumesNode(w http.ResponseWriter, pl plane, nodes map[string]*nodeView, mounts []volumeMount) (name string, ok bool) {
	for _, m := range mounts {
		holder := rt.volumeHolder(nodes, m.Name)
		switch {
		case holder == "":
			return "", true
		case name != "" && holder != name:
			pl.fail(w, http.StatusConflict, CodeVolumesApart, fmt.Sprintf("The sandbox mounts volumes on two nodes (%q on %q, another on %q); a sandbox runs on one node and mounts only its volumes. Mount volumes of one node, or copy the files across.", m.Name, holder, name))
			return "", false
		}
		name = holder
	}
	if n := nodes[name]; name != "" && (n == nil || !n.live) {
		w.Header().Set("Retry-After", "5")
		pl.fail(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf("The sandbox mounts volumes on node %q, whose lease has lapsed; try again once the node is back.", name))
		return "", false
	}
	return name, true
}

// volumeMount is what the router reads of a create's volume mounts.
type volumeMount struct {
	Name string `json:"name"`
}

// onlyNode keeps node name of nodes, for a create bound to its volumes' node.
func onlyNode(nodes map[string]*nodeView, name string) map[string]*nodeView {
	if name == "" {
		return nodes
	}
	return map[string]*nodeView{name: nodes[name]}
}
