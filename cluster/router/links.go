package router

import (
	"net/http"
	"sort"
	"strings"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/portlink"
)

// Port links through the router (docs/cluster.md, "Port links"). A link's token is all its
// holder has, and the router keeps no record of links: a node of the cluster begins each
// link's id with its tag (portlink.NodeTag of its name), so any router replica finds the
// node from the token alone, among the BothyNodes it already watches. The node checks the
// whole token, tag included (it is signed with the rest): a forged tag reaches a node that
// has no such link and answers 404 link-not-found, as a forged signature does.

// linkNotFound is what a node answers for a link it does not hold, word for word.
const linkNotFound = "This link does not exist, has expired or was revoked; ask for a new one."

// serveLink sends a link's request (/p/{token}/{path...}, every method, websockets too) to
// the node whose tag begins the link's id.
func (rt *Router) serveLink(w http.ResponseWriter, req *http.Request) {
	token, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(req.URL.Path, "/p"), "/"), "/")
	tag, ok := portlink.TokenTag(token)
	if !ok {
		problem(w, http.StatusNotFound, string(errcode.LinkNotFound), linkNotFound)
		return
	}
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		rt.log.Warn("router: reading the nodes", "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's nodes; try again shortly.")
		return
	}
	names := make([]string, 0, len(nodes))
	for name := range nodes {
		names = append(names, name)
	}
	sort.Strings(names) // two nodes sharing a 64-bit tag would not happen; if they did, one rule
	for _, name := range names {
		if portlink.NodeTag(name) != tag {
			continue
		}
		n := nodes[name]
		if !n.live {
			// Not named: a link's holder is no client of the API.
			w.Header().Set("Retry-After", "5")
			problem(w, http.StatusServiceUnavailable, CodeNodeLost, "The node that holds this link is down or cut off; try again later.")
			return
		}
		rt.proxyToNode(w, req, name, n, planeLink, "a port link")
		return
	}
	// No node of the cluster made it (or a link made before its node was a cluster's, whose
	// id carries no tag): as a node answers an unknown link.
	problem(w, http.StatusNotFound, string(errcode.LinkNotFound), linkNotFound)
}
