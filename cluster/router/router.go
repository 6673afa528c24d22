// Package router is the cluster's stateless front (`bothyd router`, docs/cluster.md): it
// serves bothy's API for the whole cluster by placing each create on a node
// (package cluster/placement) and proxying every call on a sandbox — streams and websockets
// included — to the node that holds it, found through the sandbox's Sandbox object. Any number
// of replicas may run: what a router keeps is a cache of recent placements and the
// reservations of its own creates in flight, both rebuilt from the objects.
//
// It must not change a sandbox itself or answer for a node: a node's answer, status code and
// problem body, reaches the client as the node gave it. Paths it does not route yet answer
// 501.
//
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=bothy-system,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.bothy.dev,namespace=bothy-system,resources=sandboxes,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.bothy.dev,resources=bothynodes,verbs=get;list;watch
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
)

// The codes of the router's own problems, beside the nodes' (errcode's).
const (
	// CodeNodeLost: the sandbox's node's lease has lapsed; the call may work once the node
	// is back (503, Retry-After).
	CodeNodeLost = "node-lost"
	// CodeNoNode: no node can take the create (503).
	CodeNoNode = "no-node-available"
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
	// DefaultMemoryMB and DefaultVCPUs are what a create that names no resources gets on
	// a node (the nodes' own default), for placement to reserve.
	DefaultMemoryMB, DefaultVCPUs int64
	MaxCreateBytes                int64
	Logger                        *slog.Logger
	// Transport reaches the nodes; http.DefaultTransport when nil.
	Transport http.RoundTripper
}

// Router is the cluster's HTTP front.
type Router struct {
	cfg    Config
	placer *placement.Placer
	log    *slog.Logger
	http   *http.Client

	mu     sync.Mutex
	recent map[string]recentPlacement
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
	return &Router{
		cfg: cfg, placer: placement.New(), log: cfg.Logger,
		http:   &http.Client{Transport: cfg.Transport, Timeout: 10 * time.Second},
		recent: map[string]recentPlacement{},
	}, nil
}

// ServeHTTP routes one request.
func (rt *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/healthz" {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	if !rt.authorized(req) {
		problem(w, http.StatusUnauthorized, "unauthorized", "The request has no valid bearer token; send the router's token in the Authorization header.")
		return
	}
	rest, ok := strings.CutPrefix(req.URL.Path, "/v1/sandboxes")
	switch {
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

func (rt *Router) authorized(req *http.Request) bool {
	if rt.cfg.Token == "" {
		return true
	}
	got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(rt.cfg.Token)) == 1
}

// createRequest is what placement reads of a create's body; the node validates the rest.
type createRequest struct {
	ID         string `json:"id"`
	Image      string `json:"image"`
	Template   string `json:"template"`
	Generation string `json:"generation"`
	Resources  *struct {
		VCPUs    *int64 `json:"vcpus"`
		MemoryMB *int64 `json:"memory_mb"`
	} `json:"resources"`
}

// create places a create on a node and forwards it there.
func (rt *Router) create(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, rt.cfg.MaxCreateBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "invalid-request", "The request body could not be read; send it again.")
		return
	}
	if int64(len(body)) > rt.cfg.MaxCreateBytes {
		problem(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The create request is larger than %d bytes; send a smaller one.", rt.cfg.MaxCreateBytes))
		return
	}
	var cr createRequest
	_ = json.Unmarshal(body, &cr) // a body that does not parse is the node's to refuse, as on one node
	want := placement.Request{MemoryMB: rt.cfg.DefaultMemoryMB, MilliCPU: rt.cfg.DefaultVCPUs * 1000,
		Image: cr.Image, Template: cr.Template, Generation: cr.Generation}
	if cr.Resources != nil && cr.Resources.MemoryMB != nil {
		want.MemoryMB = *cr.Resources.MemoryMB
	}
	if cr.Resources != nil && cr.Resources.VCPUs != nil {
		want.MilliCPU = *cr.Resources.VCPUs * 1000
	}
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		rt.log.Warn("router: reading the nodes", "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's nodes from the API server; try again shortly.")
		return
	}
	res, err := rt.placer.Place(placementNodes(nodes), want)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster can take this sandbox now: every node is full, cordoned, draining, unhealthy or lost. Delete sandboxes, add a node, or ask for less memory or CPU.")
		return
	}
	target := nodes[res.Node()]
	status, err := rt.forward(w, req, target, bytes.NewReader(body))
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

// list answers GET /v1/sandboxes for the whole cluster. A node's list is in id order and its
// cursor is the last id of the page, so the same query (filters, cursor, limit) to every live
// node, merged by id and cut at the limit, is exactly the page one node holding them all
// would give, and the last id is again the cursor. A live node that does not answer fails the
// list rather than leave its sandboxes out unsaid; a lost node's sandboxes are left out (its
// Sandbox objects read node-lost).
func (rt *Router) list(w http.ResponseWriter, req *http.Request) {
	limit := 100
	if v := req.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			problem(w, http.StatusBadRequest, "invalid-request", "The limit must be an integer from 1 to 1000.")
			return
		}
		limit = n
	}
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		rt.log.Warn("router: reading the nodes", "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's nodes from the API server; try again shortly.")
		return
	}
	type item struct {
		id  string
		raw json.RawMessage
	}
	var items []item
	more := false
	for name, n := range nodes {
		if !n.live {
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
				items = append(items, item{id: head.ID, raw: raw})
			}
		}
		more = more || page.NextCursor != ""
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
	for _, h := range []string{"Content-Type", "Accept", "Idempotency-Key"} {
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

// proxySandbox sends a call on sandbox id to its node, streaming both ways.
func (rt *Router) proxySandbox(w http.ResponseWriter, req *http.Request, id string) {
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		rt.log.Warn("router: reading the nodes", "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's nodes from the API server; try again shortly.")
		return
	}
	name, err := rt.locate(req.Context(), id, nodes)
	if err != nil {
		rt.log.Warn("router: locating a sandbox", "sandbox", id, "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the cluster's sandboxes from the API server; try again shortly.")
		return
	}
	n := nodes[name]
	switch {
	case name == "":
		problem(w, http.StatusNotFound, "sandbox-not-found", fmt.Sprintf("No sandbox %q is on any node of the cluster; list the sandboxes to find yours.", id))
		return
	case n == nil || !n.live:
		w.Header().Set("Retry-After", "5")
		problem(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf("The sandbox %q is on node %q, whose lease has lapsed: the node is down or cut off. Its sandboxes answer again once it is back; try again later.", id, name))
		return
	}
	target, err := nodeAddress(n)
	if err != nil {
		problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q publishes no usable address; its operator must fix it.", name))
		return
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			rt.nodeAuth(pr.Out.Header)
		},
		Transport:     rt.cfg.Transport,
		FlushInterval: -1, // streams (logs, events, exec output) pass through as written
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			rt.log.Warn("router: proxying to a node failed", "node", name, "sandbox", id, "err", err)
			problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer for sandbox %q; try again.", name, id))
		},
	}
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

// nodeView is a node as the router sees it: its object and whether its lease is live.
type nodeView struct {
	obj  v1alpha1.BothyNode
	live bool
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
	live := map[string]bool{}
	for _, l := range leases.Items {
		name, ok := strings.CutPrefix(l.Name, node.LeasePrefix)
		if !ok || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name {
			continue
		}
		live[name] = node.LeaseLive(l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, now)
	}
	out := make(map[string]*nodeView, len(list.Items))
	for _, n := range list.Items {
		out[n.Name] = &nodeView{obj: n, live: live[n.Name]}
	}
	return out, nil
}

func placementNodes(nodes map[string]*nodeView) []placement.Node {
	out := make([]placement.Node, 0, len(nodes))
	for name, n := range nodes {
		if n.obj.Status.Address == "" {
			continue // not published yet
		}
		out = append(out, placement.Node{Name: name, Live: n.live, Spec: n.obj.Spec, Status: n.obj.Status})
	}
	return out
}

// problem writes an application/problem+json body, as the nodes' server does.
func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "code": code, "detail": detail,
	})
}
