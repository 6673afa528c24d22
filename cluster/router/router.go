// Package router is the cluster's stateless front (`bothyd router`, docs/cluster.md): it
// serves bothy's API for the whole cluster by placing each create on a node
// (package cluster/placement) and proxying every call on a sandbox — streams and websockets
// included — to the node that holds it, found through the sandbox's Sandbox object. Any number
// of replicas may run: what a router keeps is a cache of recent placements, the
// reservations of its own creates in flight, both rebuilt from the objects, and the nodes'
// recent events (events.go). It serves E2B's API the same way (e2b.go), and opens a port
// link on the node whose tag its id carries (links.go).
//
// It must not change a sandbox itself or answer for a node: a node's answer, status code and
// problem body, reaches the client as the node gave it. Paths it does not route yet answer
// 501. Of a node's BothyNode it writes the operator's spec alone (cordon and drain, nodes.go;
// patch on bothynodes, never on their status).
//
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=bothy-system,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.bothy.dev,namespace=bothy-system,resources=sandboxes,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.bothy.dev,resources=bothynodes,verbs=get;list;watch;patch
package router

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/cluster/placement"
	"github.com/bothy/bothy/e2b"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/internal/forwarded"
	"github.com/bothy/bothy/naming"
)

// The codes of the router's own problems, beside the nodes' (errcode's).
const (
	// CodeNodeLost: the sandbox's node's lease has lapsed; the call may work once the node
	// is back (503, Retry-After).
	CodeNodeLost = "node-lost"
	// CodeNoNode: no node can take the create (503).
	CodeNoNode = "no-node-available"
	// CodeVolumesApart: a create mounts volumes that live on different nodes (409); a
	// sandbox runs on one node and mounts only that node's volumes (volumes.go).
	CodeVolumesApart = "volumes-apart"
)

// Defaults of Config.
const (
	DefaultMaxCreateBytes = 1 << 20
	// recentFor is how long a router remembers where it placed a sandbox: until the node's
	// Sandbox object, written right after the create, is surely there.
	recentFor = time.Minute
)

// Config configures a Router.
type Config struct {
	// Client reads the Sandbox, BothyNode and Lease objects.
	Client    client.Client
	Namespace string
	// Token is what clients present; empty: none asked (loopback tests only).
	Token string
	// NodeToken is what the router presents to the nodes.
	NodeToken string
	// OperatorToken, when set, is the operator's: cordoning and draining a node (the nodes
	// API's writes) need it, and it is taken wherever Token is. Empty: Token may do both.
	OperatorToken string
	// DefaultMemoryMB and DefaultVCPUs are what a create that names no resources gets on
	// a node (the nodes' own default), for placement to reserve.
	DefaultMemoryMB, DefaultVCPUs int64
	MaxCreateBytes                int64
	Logger                        *slog.Logger
	// Transport reaches the nodes; http.DefaultTransport when nil.
	Transport http.RoundTripper
	// MaxEventClients bounds the event streams served at once; DefaultMaxEventClients
	// when 0.
	MaxEventClients int
	// Dashboard serves the web console (package web) at /, /docs and /assets/; none when
	// nil (dashboard.go).
	Dashboard http.Handler
}

// Router is the cluster's HTTP front.
type Router struct {
	cfg    Config
	placer *placement.Placer
	log    *slog.Logger
	http   *http.Client

	mu     sync.Mutex
	recent map[string]recentPlacement
	// captures are the generations this router captured lately, by template (templates.go).
	captures map[string]recentCapture
	// imports are the images this router imported lately, by name, and their node (images.go).
	imports map[string]recentPlacement

	events *eventHub
}

type recentPlacement struct {
	node string
	at   time.Time
}

// New makes a Router.
func New(cfg Config) (*Router, error) {
	if cfg.Client == nil || cfg.Namespace == "" {
		return nil, errors.New("router: a client and a namespace are required")
	}
	if cfg.MaxCreateBytes == 0 {
		cfg.MaxCreateBytes = DefaultMaxCreateBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.MaxEventClients == 0 {
		cfg.MaxEventClients = DefaultMaxEventClients
	}
	rt := &Router{
		cfg: cfg, placer: placement.New(), log: cfg.Logger,
		http:   &http.Client{Transport: cfg.Transport, Timeout: 10 * time.Second},
		recent: map[string]recentPlacement{}, captures: map[string]recentCapture{},
	}
	rt.events = newEventHub(rt)
	return rt, nil
}

// Run follows the nodes' event streams, for /v1/events, until ctx ends. A router serves
// everything else without it.
func (rt *Router) Run(ctx context.Context) {
	rt.events.run(ctx)
}

// ServeHTTP routes one request.
func (rt *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/healthz" {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	// One request id for the router's answer and the node's: the node takes it from the
	// call, so a client quotes one id that both logs hold.
	rid := req.Header.Get("X-Request-Id")
	if !validRequestID(rid) {
		rid = naming.RandomHex(12)
		req.Header.Set("X-Request-Id", rid)
	}
	w.Header().Set("X-Request-Id", rid)
	if e2b.Claims(req) {
		// E2B's API carries its own credentials (X-API-KEY, a sandbox's access token).
		rt.serveE2B(w, req)
		return
	}
	if req.URL.Path == "/p" || strings.HasPrefix(req.URL.Path, "/p/") {
		// A port link is its own credential (links.go): no router token is asked, and it is
		// no call of the dashboard's, whose Origin check is not its.
		rt.serveLink(w, req)
		return
	}
	if !rt.browserAllowed(w, req) || rt.serveOpen(w, req) {
		return
	}
	if !rt.authorized(req) {
		problem(w, http.StatusUnauthorized, "unauthorized", "The request has no valid bearer token; send the router's token in the Authorization header.")
		return
	}
	rt.serveAPI(w, req)
}

// under reports whether path is prefix or below it.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// serveAPI routes an authorized call of bothy's API.
func (rt *Router) serveAPI(w http.ResponseWriter, req *http.Request) {
	rest, ok := strings.CutPrefix(req.URL.Path, "/v1/sandboxes")
	switch p := req.URL.Path; {
	case p == "/v1/events" && req.Method == http.MethodGet:
		rt.serveEvents(w, req)
	case p == "/v1/info" && req.Method == http.MethodGet:
		rt.info(w, req)
	case under(p, "/v1/nodes"):
		rt.serveNodes(w, req)
	case under(p, "/v1/images"):
		rt.serveImages(w, req)
	case under(p, "/v1/volumes"):
		rt.serveVolumes(w, req)
	case under(p, "/v1/templates"):
		rt.serveTemplates(w, req)
	case under(p, "/v1/webhooks"):
		rt.serveWebhooks(w, req) // webhooks.go
	case under(p, "/v1/secrets"):
		rt.serveSecrets(w, req) // secrets.go
	case ok && rest == "" && req.Method == http.MethodPost:
		rt.create(w, req)
	case ok && rest == "" && req.Method == http.MethodGet:
		rt.list(w, req)
	case ok && strings.HasPrefix(rest, "/") && len(rest) > 1:
		id, _, _ := strings.Cut(rest[1:], "/")
		rt.proxySandbox(w, req, id)
	default:
		problem(w, http.StatusNotImplemented, "not-implemented", "The cluster router does not serve "+req.Method+" "+req.URL.Path+" yet (docs/cluster.md); call a node directly.")
	}
}

// authorized checks the client's token: the Authorization header, or, on the routes where a
// node takes it too (an EventSource and a browser's websocket cannot set headers), the
// access_token parameter.
func (rt *Router) authorized(req *http.Request) bool {
	if rt.cfg.Token == "" {
		return true
	}
	got := presentedToken(req)
	return tokenIs(got, rt.cfg.Token) || tokenIs(got, rt.cfg.OperatorToken)
}

// operator reports whether the call may do what only the operator may (cordon and drain):
// it carries the operator's token, or the router has none and the client's token does.
func (rt *Router) operator(req *http.Request) bool {
	if rt.cfg.OperatorToken == "" {
		return true // authorized already
	}
	return tokenIs(presentedToken(req), rt.cfg.OperatorToken)
}

// presentedToken is the token a call carries: the Authorization header's, or, on the routes
// where a node takes it too, the access_token parameter.
func presentedToken(req *http.Request) string {
	got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok && queryTokenRoute(req.URL.Path) {
		got = req.URL.Query().Get("access_token")
	}
	return got
}

// tokenIs compares a presented token with a configured one in constant time; an empty
// configured token matches nothing.
func tokenIs(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// queryTokenRoute says whether a node takes ?access_token= on path.
func queryTokenRoute(path string) bool {
	return path == "/v1/events" || (strings.HasPrefix(path, "/v1/sandboxes/") && strings.HasSuffix(path, "/exec/stream"))
}

// createRequest is what placement reads of a create's body; the node validates the rest.
type createRequest struct {
	ID         string        `json:"id"`
	Image      string        `json:"image"`
	Template   string        `json:"template"`
	Generation string        `json:"generation"`
	Volumes    []volumeMount `json:"volumes"`
	Resources  *struct {
		VCPUs    *int64 `json:"vcpus"`
		MemoryMB *int64 `json:"memory_mb"`
	} `json:"resources"`
}

// create places a create on a node and forwards it there.
func (rt *Router) create(w http.ResponseWriter, req *http.Request) {
	body, cr, want, ok := rt.readCreate(w, req)
	if !ok {
		return
	}
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	// A sandbox that mounts volumes runs on their node.
	volumesOn, ok := rt.volumesNode(w, planeREST, nodes, cr.Volumes)
	if !ok {
		return
	}
	if name := rt.holder(req.Context(), cr.ID); name != "" {
		// The cluster holds this id already (a client's retry through another router, say):
		// the create goes to the id's node, whose store answers it (already-provisioned),
		// rather than make a second sandbox of the id on another node.
		if n := nodes[name]; n != nil && n.live {
			if _, err := rt.forward(w, req, n, bytes.NewReader(body)); err != nil {
				problem(w, http.StatusBadGateway, "unavailable", "The node that holds this id did not answer; try again.")
			}
			return
		}
		w.Header().Set("Retry-After", "5")
		problem(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf("A sandbox %q is on node %q, whose lease has lapsed; try again once the node is back, or create it with another id.", cr.ID, name))
		return
	}
	rt.withRecentCapture(nodes, cr.Template)
	rt.withRecentImport(nodes, cr.Image)
	candidates, noRoom := createCandidates(nodes, cr, volumesOn)
	candidates, noRoom = rt.secretCandidates(nodes, candidates, createSecrets(body), noRoom)
	res, status, err := rt.placeAndForward(w, req, body, nodes, candidates, want, noRoom)
	if res == nil {
		return // answered
	}
	if err != nil || status/100 != 2 {
		res.Release()
		if err != nil {
			rt.log.Warn("router: a create on a node failed", "node", res.Node(), "err", err)
			problem(w, http.StatusBadGateway, "unavailable", "The node chosen for the sandbox did not answer; try again.")
		}
		return
	}
	res.Done(time.Now())
	if cr.ID != "" {
		rt.remember(cr.ID, res.Node())
	}
}

// readCreate reads a create's body, bounded, and what placement needs of it.
func (rt *Router) readCreate(w http.ResponseWriter, req *http.Request) ([]byte, createRequest, placement.Request, bool) {
	var cr createRequest
	body, err := io.ReadAll(io.LimitReader(req.Body, rt.cfg.MaxCreateBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "invalid-request", "The request body could not be read; send it again.")
		return nil, cr, placement.Request{}, false
	}
	if int64(len(body)) > rt.cfg.MaxCreateBytes {
		problem(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The create request is larger than %d bytes; send a smaller one.", rt.cfg.MaxCreateBytes))
		return nil, cr, placement.Request{}, false
	}
	_ = json.Unmarshal(body, &cr) // a body that does not parse is the node's to refuse, as on one node
	want := placement.Request{MemoryMB: rt.cfg.DefaultMemoryMB, MilliCPU: rt.cfg.DefaultVCPUs * 1000,
		Image: cr.Image, Template: cr.Template, Generation: cr.Generation}
	if cr.Resources != nil && cr.Resources.MemoryMB != nil {
		want.MemoryMB = *cr.Resources.MemoryMB
	}
	if cr.Resources != nil && cr.Resources.VCPUs != nil {
		want.MilliCPU = *cr.Resources.VCPUs * 1000
	}
	return body, cr, want, true
}

// createCandidates are the nodes a create may be placed on — its volumes' node, else the
// nodes that hold its image (an image no node lists is left to the node placement chooses,
// which answers for it), else all — and what to answer when none of them has room. A node
// whose image list is incomplete may hold an image it does not list: it is a candidate
// beside those that list it (placement prefers those).
func createCandidates(nodes map[string]*nodeView, cr createRequest, volumesOn string) (map[string]*nodeView, string) {
	if volumesOn != "" {
		return onlyNode(nodes, volumesOn), fmt.Sprintf("The sandbox mounts volumes of node %q, which cannot take it now: it is full, cordoned, draining or unhealthy. Delete sandboxes there, ask for less memory or CPU, or try again later.", volumesOn)
	}
	if holders := imageHolders(nodes, cr.Image); holders != nil {
		for name, n := range nodes {
			if n.obj.Status.ImagesIncomplete {
				holders[name] = n
			}
		}
		return holders, fmt.Sprintf("No node that holds the image %q can take this sandbox now: each is full, cordoned, draining, unhealthy or lost. Pull the image again through the router (it pulls on every live node), delete sandboxes, or try again later.", cr.Image)
	}
	return nodes, "No node of the cluster can take this sandbox now: every node is full, cordoned, draining, unhealthy or lost. Delete sandboxes, add a node, or ask for less memory or CPU."
}

// placeAndForward places the create among candidates and forwards it to the node chosen. A
// node that refuses it for want of room (node-full: another placer filled it meanwhile) or
// because it drains made nothing: the create is placed again among the nodes not tried yet.
// A node that answers image-not-found while another candidate not tried yet lists the image
// or has an incomplete image list (so may hold it unlisted) made nothing either: the create
// is placed again among those possible holders alone; when none is left, the node's answer
// is the client's, as one node's would be.
// It returns the reservation and the node's status, or a nil reservation when it answered
// the client itself (no node has room).
func (rt *Router) placeAndForward(w http.ResponseWriter, req *http.Request, body []byte, nodes, candidates map[string]*nodeView, want placement.Request, noRoom string) (*placement.Reservation, int, error) {
	refused := map[string]bool{}
	for {
		res, err := rt.placer.Place(placementNodes(candidates, refused), want)
		if err != nil {
			problem(w, http.StatusServiceUnavailable, CodeNoNode, noRoom)
			return nil, 0, nil
		}
		others := possibleImageHolders(candidates, want.Image, refused, res.Node())
		answer := &createAnswer{w: w, header: http.Header{}, holdNotFound: len(others) > 0}
		status, err := rt.forward(answer, req, nodes[res.Node()], bytes.NewReader(body))
		if err == nil && answer.refusedForRoom() {
			res.Release()
			refused[res.Node()] = true
			rt.log.Info("router: a node refused a create for want of room; placing it again", "node", res.Node(), "code", answer.code)
			continue
		}
		if err == nil && answer.imageNotFound() {
			res.Release()
			refused[res.Node()] = true
			candidates = others
			rt.log.Info("router: a node does not hold a create's image; placing it again on a node that may", "node", res.Node(), "image", want.Image)
			continue
		}
		answer.pass()
		return res, status, err
	}
}

// list answers GET /v1/sandboxes for the whole cluster. A node's list is in id order and its
// cursor is the last id of the page, so the same query (filters, cursor, limit) to every live
// node, merged by id and cut at the limit, is exactly the page one node holding them all
// would give, and the last id is again the cursor. A live node that does not answer fails the
// list rather than leave its sandboxes out unsaid; a lost node's sandboxes are listed from
// their Sandbox objects, in the state node-lost (lostItems), merged by id with the rest.
func (rt *Router) list(w http.ResponseWriter, req *http.Request) {
	limit := 100
	q := req.URL.Query()
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			problem(w, http.StatusBadRequest, "invalid-request", "The limit must be an integer from 1 to 1000.")
			return
		}
		limit = n
	}
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	var items []listItem
	more := false
	// Only the router knows a sandbox node-lost: a query for that state asks no node, and a
	// query for any other state lists no lost sandbox.
	wantLost := q.Get("state") == "" || q.Get("state") == string(v1alpha1.StateNodeLost)
	for name, n := range nodes {
		if !n.live || q.Get("state") == string(v1alpha1.StateNodeLost) {
			continue
		}
		page, status, err := rt.nodeList(req, n)
		if err != nil || status != http.StatusOK {
			if status/100 == 4 {
				// The query itself is wrong: every node says so alike; pass its answer on.
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(status)
				_, _ = w.Write(page.problem)
				return
			}
			rt.log.Warn("router: a node's list failed", "node", name, "status", status, "err", err)
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the list; try again.", name))
			return
		}
		for _, raw := range page.Items {
			var head struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(raw, &head) == nil {
				items = append(items, listItem{id: head.ID, raw: raw})
			}
		}
		more = more || page.NextCursor != ""
	}
	if wantLost {
		lost, err := rt.lostItems(req.Context(), nodes, q["label"], q.Get("cursor"))
		if err != nil {
			rt.log.Warn("router: reading the sandbox objects", "err", err)
			problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's sandboxes from the API server; try again shortly.")
			return
		}
		items = append(items, lost...)
	}
	sort.Slice(items, func(i, j int) bool { return items[i].id < items[j].id })
	out := struct {
		Items      []json.RawMessage `json:"items"`
		NextCursor string            `json:"next_cursor,omitempty"`
	}{Items: []json.RawMessage{}}
	if len(items) > limit {
		items, more = items[:limit], true
	}
	for _, it := range items {
		out.Items = append(out.Items, it.raw)
	}
	if more && len(items) > 0 {
		out.NextCursor = items[len(items)-1].id
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// listItem is one sandbox of a list: its id, to merge by, and its JSON as given.
type listItem struct {
	id  string
	raw json.RawMessage
}

// lostItems lists, from their Sandbox objects, the sandboxes made on a node that is not live
// now (its lease lapsed, or its BothyNode is gone), after the cursor and carrying every label
// of the selectors, each in the state node-lost. The fields are what the object records of
// the sandbox; the object's creation stands for the sandbox's (the node writes it as it
// answers the create). An object no node has made a sandbox for yet (no status.node) is no
// sandbox and is left out, as the nodes' lists leave it out.
func (rt *Router) lostItems(ctx context.Context, nodes map[string]*nodeView, selectors []string, cursor string) ([]listItem, error) {
	var objs v1alpha1.SandboxList
	if err := rt.cfg.Client.List(ctx, &objs, client.InNamespace(rt.cfg.Namespace)); err != nil {
		return nil, err
	}
	var out []listItem
	for i := range objs.Items {
		o := &objs.Items[i]
		if n := nodes[o.Status.Node]; o.Status.Node == "" || (n != nil && n.live) || o.Name <= cursor || !hasLabels(o.Spec.Labels, selectors) {
			continue
		}
		raw, err := json.Marshal(lostSandbox(o))
		if err != nil {
			return nil, err
		}
		out = append(out, listItem{id: o.Name, raw: raw})
	}
	return out, nil
}

// hasLabels says whether labels carries every key=value of selectors (the nodes' rule).
func hasLabels(labels map[string]string, selectors []string) bool {
	for _, sel := range selectors {
		k, v, _ := strings.Cut(sel, "=")
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// lostSandbox is the API's Sandbox as the object records it, in the state node-lost.
func lostSandbox(o *v1alpha1.Sandbox) map[string]any {
	runtime := o.Spec.Runtime
	if runtime == "" {
		runtime = "namespace"
	}
	labels := o.Spec.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	sb := map[string]any{
		"id": o.Name, "state": v1alpha1.StateNodeLost, "runtime": runtime, "image": o.Spec.Image,
		"resources": map[string]int32{
			"vcpus": o.Spec.Resources.VCPUs, "memory_mb": o.Spec.Resources.MemoryMB,
			"pids": o.Spec.Resources.Pids, "disk_mb": o.Spec.Resources.DiskMB,
		},
		"labels":     labels,
		"created_at": o.CreationTimestamp.UTC().Format(time.RFC3339),
	}
	if o.Status.StartedAt != nil {
		sb["started_at"] = o.Status.StartedAt.UTC().Format(time.RFC3339)
	}
	if o.Status.ExpiresAt != nil {
		sb["expires_at"] = o.Status.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return sb
}

// nodePage is one node's answer to a list.
type nodePage struct {
	Items      []json.RawMessage `json:"items"`
	NextCursor string            `json:"next_cursor"`
	problem    []byte
}

// nodeList sends the client's list query to node n.
func (rt *Router) nodeList(req *http.Request, n *nodeView) (*nodePage, int, error) {
	u, err := nodeAddress(n)
	if err != nil {
		return nil, 0, err
	}
	u.Path, u.RawQuery = "/v1/sandboxes", req.URL.RawQuery
	out, err := http.NewRequestWithContext(req.Context(), http.MethodGet, u.String(), nil) //nolint:gosec // G704: a node's published address
	if err != nil {
		return nil, 0, err
	}
	rt.nodeAuth(out.Header)
	resp, err := rt.http.Do(out) //nolint:gosec // G704: as above
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, 0, err
	}
	page := &nodePage{}
	if resp.StatusCode != http.StatusOK {
		page.problem = body
		return page, resp.StatusCode, nil
	}
	if err := json.Unmarshal(body, page); err != nil {
		return nil, 0, err
	}
	return page, resp.StatusCode, nil
}

// forward sends req, with body, to the node and copies its answer to w; it returns the
// node's status, or an error (and writes nothing) when the node did not answer.
func (rt *Router) forward(w http.ResponseWriter, req *http.Request, n *nodeView, body io.Reader) (int, error) {
	u, err := nodeAddress(n)
	if err != nil {
		return 0, err
	}
	u.Path, u.RawQuery = req.URL.Path, req.URL.RawQuery
	out, err := http.NewRequestWithContext(req.Context(), req.Method, u.String(), body)
	if err != nil {
		return 0, err
	}
	for _, h := range []string{"Content-Type", "Accept", "Idempotency-Key", "X-Request-Id"} {
		if v := req.Header.Get(h); v != "" {
			out.Header.Set(h, v)
		}
	}
	rt.nodeAuth(out.Header)
	resp, err := rt.http.Do(out) //nolint:gosec // G704: a node's published address (nodeAddress), not the client's

	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
	return resp.StatusCode, nil
}

func (rt *Router) nodeAuth(h http.Header) {
	h.Del("Authorization")
	if rt.cfg.NodeToken != "" {
		h.Set("Authorization", "Bearer "+rt.cfg.NodeToken)
	}
}

// proxySandbox sends a call of bothy's API on sandbox id to its node, streaming both ways.
func (rt *Router) proxySandbox(w http.ResponseWriter, req *http.Request, id string) {
	rt.proxyTo(w, req, id, planeREST)
}

// plane is the API a call on a sandbox belongs to: it decides how the router answers for
// itself (bothy's problem+json, or E2B's {code, message}) and which credentials the call
// carries to the node.
type plane int

const (
	// planeREST is bothy's own API: the client's bearer token is replaced by the node's.
	planeREST plane = iota
	// planeE2B is E2B's control plane: the client's X-API-KEY is replaced by the node's token.
	planeE2B
	// planeEnvd is E2B's envd plane: the sandbox's own access token, which the node made
	// (and the router checked), and envd's basic-auth user pass through unchanged.
	planeEnvd
	// planeLink is a port link's request (/p/{token}/...): no credential but the link, which
	// the node checks; neither the client's token nor the node's goes to the node.
	planeLink
)

// fail answers a call with the router's own error, in the plane's shape.
func (p plane) fail(w http.ResponseWriter, status int, code, detail string) {
	if p == planeREST || p == planeLink {
		problem(w, status, code, detail)
		return
	}
	e2bError(w, status, detail)
}

// proxyTo sends a call on sandbox id to its node, streaming both ways.
func (rt *Router) proxyTo(w http.ResponseWriter, req *http.Request, id string, pl plane) {
	nodes, ok := rt.readNodes(w, req, pl)
	if !ok {
		return
	}
	name, err := rt.locate(req.Context(), id, nodes)
	if err != nil {
		rt.log.Warn("router: locating a sandbox", "sandbox", id, "err", err)
		pl.fail(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's sandboxes from the API server; try again shortly.")
		return
	}
	n := nodes[name]
	switch {
	case name == "":
		// On no node: one live node answers, as a single node would (404 sandbox-not-found,
		// or 400 for an id that is no id), with its own problem body and request id.
		if name = anyLive(nodes); name == "" {
			pl.fail(w, http.StatusNotFound, "sandbox-not-found", fmt.Sprintf("No sandbox %q is on any node of the cluster; list the sandboxes to find yours.", id))
			return
		}
		n = nodes[name]
	case n == nil || !n.live:
		w.Header().Set("Retry-After", "5")
		pl.fail(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf("The sandbox %q is on node %q, whose lease has lapsed: the node is down or cut off. Its sandboxes answer again once it is back; try again later.", id, name))
		return
	}
	rt.proxyToNode(w, req, name, n, pl, "sandbox "+strconv.Quote(id))
}

// proxyToNode reverse-proxies a call to node name (n), streaming both ways; what names the
// call's object in the router's own answers and log lines.
func (rt *Router) proxyToNode(w http.ResponseWriter, req *http.Request, name string, n *nodeView, pl plane, what string) {
	target, err := nodeAddress(n)
	if err != nil {
		rt.log.Warn("router: a node publishes no usable address", "node", name, "err", err)
		detail := fmt.Sprintf("Node %q publishes no usable address; its operator must fix it.", name)
		if pl == planeLink {
			detail = "The node that holds this link cannot be reached; try again later."
		}
		pl.fail(w, http.StatusBadGateway, "unavailable", detail)
		return
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			switch pl {
			case planeREST:
				rt.nodeAuth(pr.Out.Header)
				// The router checked the browser's Origin against its own host
				// (browserAllowed); the node, at another host, would take the router's own
				// page for a foreign one and refuse the dashboard's calls and terminal.
				pr.Out.Header.Del("Origin")
				// The client's token is the router's, not the node's: it goes no further.
				if q := pr.Out.URL.Query(); q.Has("access_token") {
					q.Del("access_token")
					pr.Out.URL.RawQuery = q.Encode()
				}
			case planeE2B:
				rt.nodeAPIKey(pr.Out.Header)
			case planeEnvd:
			case planeLink:
				// The service behind a link builds its URLs from the host its client
				// asked for (the node passes it on as X-Forwarded-Host): the router's,
				// not the node's address, which the client may not reach.
				pr.Out.Host = pr.In.Host
				// A link is its own credential: the node's route for it is open, so the
				// node's token is not sent, and a token the client sent (the router's)
				// goes no further, as on planeREST.
				pr.Out.Header.Del("Authorization")
				if q := pr.Out.URL.Query(); q.Has("access_token") {
					q.Del("access_token")
					pr.Out.URL.RawQuery = q.Encode()
				}
			}
			// The node counts its per-client stream bounds for the router's client, not
			// for the router, which would otherwise be one client for all of its own.
			forwarded.Set(pr.Out.Header, rt.cfg.NodeToken, pr.In.RemoteAddr)
		},
		Transport:     rt.cfg.Transport,
		FlushInterval: -1, // streams (logs, events, exec output) pass through as written
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			rt.log.Warn("router: proxying to a node failed", "node", name, "for", what, "err", err)
			detail := fmt.Sprintf("Node %q did not answer for %s; try again.", name, what)
			if pl == planeLink {
				// A link's holder is no client of the API: it learns no node's name.
				detail = "The node that holds this link did not answer; try again."
			}
			pl.fail(w, http.StatusBadGateway, "unavailable", detail)
		},
	}
	// A node may answer before the router has sent it the whole request body (a Connect
	// stream answers its headers and first event at once). By default an HTTP/1 server
	// closes the request body once the answer's headers go out; the transport's copy of the
	// body then fails, and it drops the connection to the node mid-answer (the E2B flow saw
	// streams cut, "use of closed network connection"). Full duplex keeps the body readable.
	_ = http.NewResponseController(w).EnableFullDuplex()
	proxy.ServeHTTP(w, req)
}

// locate names the node that holds sandbox id: its Sandbox object's, else where this router
// placed it lately, else the live node that answers for it; "" when none does.
func (rt *Router) locate(ctx context.Context, id string, nodes map[string]*nodeView) (string, error) {
	var obj v1alpha1.Sandbox
	err := rt.cfg.Client.Get(ctx, client.ObjectKey{Namespace: rt.cfg.Namespace, Name: id}, &obj)
	switch {
	case err == nil && obj.Status.Node != "":
		return obj.Status.Node, nil
	case err == nil, apierrors.IsNotFound(err), apierrors.IsInvalid(err):
	default:
		return "", err
	}
	if name := rt.recentNode(id); name != "" {
		return name, nil
	}
	// Not mirrored yet (a create on a node just now): ask the live nodes.
	for name, n := range nodes {
		if n.live && rt.nodeHas(ctx, n, id) {
			return name, nil
		}
	}
	return "", nil
}

func (rt *Router) nodeHas(ctx context.Context, n *nodeView, id string) bool {
	u, err := nodeAddress(n)
	if err != nil {
		return false
	}
	u.Path = "/v1/sandboxes/" + id                                               // id is one path segment: ServeHTTP cut it at the first '/'
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil) //nolint:gosec // G704: a node's published address
	if err != nil {
		return false
	}
	rt.nodeAuth(req.Header)
	resp, err := rt.http.Do(req) //nolint:gosec // G704: as above
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (rt *Router) remember(id, node string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	now := time.Now()
	for k, v := range rt.recent {
		if now.Sub(v.at) > recentFor {
			delete(rt.recent, k)
		}
	}
	rt.recent[id] = recentPlacement{node: node, at: now}
}

func (rt *Router) recentNode(id string) string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if p, ok := rt.recent[id]; ok && time.Since(p.at) <= recentFor {
		return p.node
	}
	return ""
}

// holder is the node that holds id by its Sandbox object (from the cache) or this router's
// recent placements; "" for none, or no id.
func (rt *Router) holder(ctx context.Context, id string) string {
	if id == "" {
		return ""
	}
	var obj v1alpha1.Sandbox
	if err := rt.cfg.Client.Get(ctx, client.ObjectKey{Namespace: rt.cfg.Namespace, Name: id}, &obj); err == nil {
		if obj.Status.Node != "" {
			return obj.Status.Node
		}
		if n := obj.Labels[v1alpha1.NodeLabel]; n != "" {
			return n
		}
	}
	return rt.recentNode(id)
}

// nodeAddress is the base URL of n's API: what n published, if it is a plain http or https
// URL with a host and nothing else. The router sends the node token there, so the address is
// trusted as far as the RBAC that lets only nodes write BothyNode status (docs/cluster.md).
func nodeAddress(n *nodeView) (*url.URL, error) {
	u, err := url.Parse(n.obj.Status.Address)
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("node %s publishes the address %q, which is no plain http(s)://host:port", n.obj.Name, n.obj.Status.Address)
	}
	u.Path = ""
	return u, nil
}

// nodeView is a node as the router sees it: its object, whether its lease is live, and
// when the lease was last renewed and for how long (zero without a lease).
type nodeView struct {
	obj      v1alpha1.BothyNode
	live     bool
	renewed  time.Time
	leaseFor time.Duration
}

// readNodes is nodes for a call: when the API server cannot be read, it answers the call
// itself (503, in the plane's shape) and logs why.
func (rt *Router) readNodes(w http.ResponseWriter, req *http.Request, pl plane) (map[string]*nodeView, bool) {
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		rt.log.Warn("router: reading the nodes", "err", err)
		pl.fail(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's nodes from the API server; try again shortly.")
		return nil, false
	}
	return nodes, true
}

// firstLive is readNodes and the live node whose name sorts first, for a call one node
// answers for the cluster; when none is live it answers the call itself (503).
func (rt *Router) firstLive(w http.ResponseWriter, req *http.Request) (map[string]*nodeView, string, bool) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return nil, "", false
	}
	name := anyLive(nodes)
	if name == "" {
		problem(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live to answer; add a node or wait for one to come back.")
		return nil, "", false
	}
	return nodes, name, true
}

// nodes reads every BothyNode and judges its lease by the router's clock.
func (rt *Router) nodes(ctx context.Context) (map[string]*nodeView, error) {
	var list v1alpha1.BothyNodeList
	if err := rt.cfg.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	var leases coordinationv1.LeaseList
	if err := rt.cfg.Client.List(ctx, &leases, client.InNamespace(rt.cfg.Namespace)); err != nil {
		return nil, err
	}
	now := time.Now()
	held := map[string]*coordinationv1.Lease{}
	for i, l := range leases.Items {
		name, ok := strings.CutPrefix(l.Name, node.LeasePrefix)
		if !ok || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name {
			continue
		}
		held[name] = &leases.Items[i]
	}
	out := make(map[string]*nodeView, len(list.Items))
	for _, n := range list.Items {
		v := &nodeView{obj: n}
		if l := held[n.Name]; l != nil {
			v.renewed, v.leaseFor = l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
			v.live = node.LeaseLive(v.renewed, v.leaseFor, now) && sameStart(l, &n)
		}
		out[n.Name] = v
	}
	return out, nil
}

// sameStart says whether lease l and node n's status were written by one process of the
// node: a restarted node renews its lease at once, and until the router reads the status
// the new process wrote, its address may be the last process's. A lease without the label
// is a node from before it, judged by its lease alone.
func sameStart(l *coordinationv1.Lease, n *v1alpha1.BothyNode) bool {
	id, ok := l.Labels[node.StartLabel]
	return !ok || id == n.Status.StartID
}

// possibleImageHolders are the candidates other than skip and those refused that list image
// or whose image list is incomplete; none for no image.
func possibleImageHolders(candidates map[string]*nodeView, image string, refused map[string]bool, skip string) map[string]*nodeView {
	if image == "" {
		return nil
	}
	out := map[string]*nodeView{}
	for name, n := range candidates {
		if name == skip || refused[name] {
			continue
		}
		if n.obj.Status.ImagesIncomplete || slices.Contains(n.obj.Status.Images, image) {
			out[name] = n
		}
	}
	return out
}

func placementNodes(nodes map[string]*nodeView, refused map[string]bool) []placement.Node {
	out := make([]placement.Node, 0, len(nodes))
	for name, n := range nodes {
		if n.obj.Status.Address == "" || refused[name] {
			continue // not published yet, or it refused this create
		}
		out = append(out, placement.Node{Name: name, Live: n.live, Spec: n.obj.Spec, Status: n.obj.Status})
	}
	return out
}

// problem writes an application/problem+json body, as the nodes' server does: with the
// request id ServeHTTP set on the answer, so that the router's own problems quote it too.
func problem(w http.ResponseWriter, status int, code, detail string) {
	body := map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "code": code, "detail": detail,
	}
	if rid := w.Header().Get("X-Request-Id"); rid != "" {
		body["request_id"] = rid
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// anyLive is the live node whose name sorts first, "" when none is.
func anyLive(nodes map[string]*nodeView) string {
	best := ""
	for name, n := range nodes {
		if n.live && n.obj.Status.Address != "" && (best == "" || name < best) {
			best = name
		}
	}
	return best
}

// validRequestID reports whether a client's X-Request-Id is safe to pass on and echo (the
// nodes' rule).
func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// info answers GET /v1/info with one live node's (the first by name): the nodes of a cluster
// run one release with one configuration, as their DaemonSet makes them, so any node's
// version, runtimes, images and limits are the cluster's; its storage figures are its own.
// During a rollout two nodes may differ, and the answer is the first node's.
func (rt *Router) info(w http.ResponseWriter, req *http.Request) {
	nodes, name, ok := rt.firstLive(w, req)
	if !ok {
		return
	}
	held := &heldAnswer{header: http.Header{}}
	if _, err := rt.forward(held, req, nodes[name], nil); err != nil {
		problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer; try again.", name))
		return
	}
	// The router adds what only it knows: that it serves a cluster, and its nodes (the
	// contract's Info.cluster), by which a client such as the dashboard offers the nodes API.
	var fields map[string]json.RawMessage
	if held.status == http.StatusOK && json.Unmarshal(held.body.Bytes(), &fields) == nil && fields != nil {
		var c struct {
			Nodes     int32 `json:"nodes"`
			LiveNodes int32 `json:"live_nodes"`
		}
		for _, n := range nodes {
			c.Nodes++
			if n.live {
				c.LiveNodes++
			}
		}
		fields["cluster"], _ = json.Marshal(c)
		held.header.Del("Content-Length")
		for k, v := range held.header {
			w.Header()[k] = v
		}
		writeJSON(w, http.StatusOK, fields)
		return
	}
	for k, v := range held.header {
		w.Header()[k] = v
	}
	w.WriteHeader(held.status)
	_, _ = w.Write(held.body.Bytes()) //nolint:gosec // G705: a node's answer, passed on as the proxy passes every other
}

// heldAnswer keeps a node's whole answer for the router to amend.
type heldAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *heldAnswer) Header() http.Header { return a.header }
func (a *heldAnswer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}
func (a *heldAnswer) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return a.body.Write(b)
}

// createAnswer holds a node's 503 to a create until the router knows whether to pass it on
// or, for a refusal that made nothing (node-full, node-draining), to place the create on
// another node; any other answer passes through as it is written.
type createAnswer struct {
	w      http.ResponseWriter
	header http.Header
	status int
	body   bytes.Buffer
	passed bool
	code   string
	// holdNotFound holds a 404 too, for imageNotFound: another node may hold the image.
	holdNotFound bool
}

func (a *createAnswer) Header() http.Header { return a.header }

func (a *createAnswer) WriteHeader(status int) {
	a.status = status
	if status != http.StatusServiceUnavailable && (status != http.StatusNotFound || !a.holdNotFound) {
		a.pass()
	}
}

func (a *createAnswer) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	if a.passed {
		return a.w.Write(b)
	}
	if a.body.Len()+len(b) > 64<<10 {
		a.pass() // no problem body of a node's is this long
		return a.w.Write(b)
	}
	return a.body.Write(b)
}

// refusedForRoom says whether the node refused the create with node-full or node-draining.
func (a *createAnswer) refusedForRoom() bool {
	if a.passed || a.status != http.StatusServiceUnavailable {
		return false
	}
	code := a.problemCode()
	return code == string(errcode.NodeFull) || code == string(errcode.NodeDraining)
}

// imageNotFound says whether the node answered the create image-not-found, held back.
func (a *createAnswer) imageNotFound() bool {
	return !a.passed && a.status == http.StatusNotFound && a.problemCode() == string(errcode.ImageNotFound)
}

// problemCode is the code of the problem held, "" when it is none.
func (a *createAnswer) problemCode() string {
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(a.body.Bytes(), &p) != nil {
		return ""
	}
	a.code = p.Code
	return p.Code
}

// pass writes what is held to the client, once.
func (a *createAnswer) pass() {
	if a.passed || a.status == 0 {
		return
	}
	a.passed = true
	for k, v := range a.header {
		a.w.Header()[k] = v
	}
	a.w.WriteHeader(a.status)
	_, _ = a.w.Write(a.body.Bytes()) //nolint:gosec // G705: a node's answer, passed on as the proxy passes every other
}
