package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
)

// The nodes API (listNodes, getNode, patchNode in openapi.yaml; docs/cluster.md, "Nodes"):
// the router's view of each BothyNode and its lease, and the operator's part of a node — its
// spec's cordon and drain — written through the API server as `kubectl patch bothynode` does.
// The router writes nothing else of a node: its status is the node's own, and the RBAC gives
// the router patch on bothynodes, never on bothynodes/status.

// maxNodePatchBytes bounds a PATCH /v1/nodes/{name} body: three small fields.
const maxNodePatchBytes = 4 << 10

// nodeName is a BothyNode's name, a Kubernetes object name (the contract's NodeName).
var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// serveNodes answers /v1/nodes and /v1/nodes/{name}.
func (rt *Router) serveNodes(w http.ResponseWriter, req *http.Request) {
	rest := strings.TrimPrefix(req.URL.Path, "/v1/nodes")
	if rest == "" {
		if req.Method != http.MethodGet {
			methodNotAllowed(w, req, http.MethodGet)
			return
		}
		rt.listNodes(w, req)
		return
	}
	name := strings.TrimPrefix(rest, "/")
	if !strings.HasPrefix(rest, "/") || name == "" || strings.Contains(name, "/") {
		problem(w, http.StatusNotFound, "not-found", "There is no route "+req.URL.Path+"; see /openapi.yaml for the API.")
		return
	}
	if len(name) > 253 || !nodeName.MatchString(name) {
		problem(w, http.StatusBadRequest, "invalid-request", "A node's name is a Kubernetes object name: up to 253 characters of a-z, 0-9, '-' and '.', starting and ending with a letter or digit.")
		return
	}
	switch req.Method {
	case http.MethodGet:
		rt.getNode(w, req, name)
	case http.MethodPatch:
		if !rt.operator(req) {
			problem(w, http.StatusForbidden, string(errcode.Forbidden), "Cordoning and draining a node need the operator's token (bothyd router --operator-token-file); the clients' token reads the nodes only.")
			return
		}
		rt.patchNode(w, req, name)
	default:
		methodNotAllowed(w, req, http.MethodGet, http.MethodPatch)
	}
}

func methodNotAllowed(w http.ResponseWriter, req *http.Request, allowed ...string) {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	problem(w, http.StatusMethodNotAllowed, "method-not-allowed", fmt.Sprintf("%s is not allowed on %s; use %s (see /openapi.yaml for the API).", req.Method, req.URL.Path, strings.Join(allowed, " or ")))
}

func (rt *Router) listNodes(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	out := openapi.NodeList{Items: make([]openapi.Node, 0, len(nodes))}
	for _, n := range nodes {
		out.Items = append(out.Items, apiNode(n))
	}
	sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].Name < out.Items[j].Name })
	writeJSON(w, http.StatusOK, out)
}

func (rt *Router) getNode(w http.ResponseWriter, req *http.Request, name string) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	n := nodes[name]
	if n == nil {
		problem(w, http.StatusNotFound, string(errcode.NodeNotFound), fmt.Sprintf("The cluster has no node %q; list the nodes to find its name.", name))
		return
	}
	writeJSON(w, http.StatusOK, apiNode(n))
}

// nodePatch is a decoded PATCH body: a nil field is left as it is; clearDeadline is an
// explicit null drain_deadline.
type nodePatch struct {
	cordoned, draining *bool
	deadline           *time.Time
	clearDeadline      bool
}

// decodeNodePatch reads the NodePatch body by hand: the router has no validator of the
// contract in front of it, and a null drain_deadline (clear it) must be told from an absent
// one (leave it).
func decodeNodePatch(body []byte) (*nodePatch, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return nil, fmt.Errorf("the body must be a JSON object with any of cordoned, draining and drain_deadline")
	}
	if dec.More() {
		return nil, fmt.Errorf("the body must be one JSON object")
	}
	p := &nodePatch{}
	for k, raw := range fields {
		switch k {
		case "cordoned", "draining":
			var b bool
			if err := json.Unmarshal(raw, &b); err != nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
				return nil, fmt.Errorf("%s must be true or false", k)
			}
			if k == "cordoned" {
				p.cordoned = &b
			} else {
				p.draining = &b
			}
		case "drain_deadline":
			if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
				p.clearDeadline = true
				continue
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil || len(s) > 64 {
				return nil, fmt.Errorf("drain_deadline must be an RFC 3339 time or null")
			}
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return nil, fmt.Errorf("drain_deadline must be an RFC 3339 time (2026-12-07T13:00:00Z) or null")
			}
			p.deadline = &t
		default:
			return nil, fmt.Errorf("%q is no field of a node's patch; send any of cordoned, draining and drain_deadline", k)
		}
	}
	return p, nil
}

// patchNode writes the operator's part of a BothyNode's spec with a merge patch of the
// fields given, and answers the node as the API server has it after the change.
func (rt *Router) patchNode(w http.ResponseWriter, req *http.Request, name string) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxNodePatchBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "invalid-request", "The request body could not be read; send it again.")
		return
	}
	if len(body) > maxNodePatchBytes {
		problem(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("A node's patch is at most %d bytes; send only cordoned, draining and drain_deadline.", maxNodePatchBytes))
		return
	}
	p, err := decodeNodePatch(body)
	if err != nil {
		problem(w, http.StatusBadRequest, "invalid-request", "The node's patch is not valid: "+err.Error()+".")
		return
	}
	ctx := req.Context()
	var obj v1alpha1.BothyNode
	if err := rt.cfg.Client.Get(ctx, client.ObjectKey{Name: name}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			problem(w, http.StatusNotFound, string(errcode.NodeNotFound), fmt.Sprintf("The cluster has no node %q; list the nodes to find its name.", name))
			return
		}
		rt.log.Warn("router: reading a node", "node", name, "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The router cannot read the node from the API server; try again shortly.")
		return
	}
	before := obj.DeepCopy()
	if p.cordoned != nil {
		obj.Spec.Cordoned = *p.cordoned
	}
	if p.draining != nil {
		obj.Spec.Draining = *p.draining
	}
	if p.deadline != nil {
		obj.Spec.DrainDeadline = &metav1.Time{Time: *p.deadline}
	}
	if p.clearDeadline {
		obj.Spec.DrainDeadline = nil
	}
	// A merge patch of the spec alone: the node's concurrent status writes go to the status
	// subresource and cannot be lost to it, nor it to them.
	if err := rt.cfg.Client.Patch(ctx, &obj, client.MergeFrom(before)); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			problem(w, http.StatusNotFound, string(errcode.NodeNotFound), fmt.Sprintf("The cluster has no node %q (it was removed); list the nodes to find its name.", name))
		case apierrors.IsInvalid(err):
			problem(w, http.StatusBadRequest, "invalid-request", "The API server refused the node's patch: "+apiReason(err)+".")
		default:
			rt.log.Warn("router: patching a node", "node", name, "err", err)
			problem(w, http.StatusServiceUnavailable, "unavailable", "The router could not write the node's spec to the API server; try again shortly.")
		}
		return
	}
	rt.log.Info("router: a node's spec changed", "node", name, "cordoned", obj.Spec.Cordoned, "draining", obj.Spec.Draining,
		"drain_deadline", obj.Spec.DrainDeadline, "request_id", w.Header().Get("X-Request-Id"))
	nodes, err := rt.nodes(ctx)
	n := &nodeView{obj: obj}
	if err == nil && nodes[name] != nil {
		// The lease as the router sees it, and the spec as the API server answered the patch
		// (the router's cache may not have it yet).
		n = nodes[name]
		n.obj.Spec = obj.Spec
	}
	writeJSON(w, http.StatusOK, apiNode(n))
}

// apiReason is the API server's message of a refusal, without the object's kind and name.
func apiReason(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return strings.TrimSuffix(st.Status().Message, ".")
	}
	return "the change is not valid"
}

// apiNode is n in the contract's form.
func apiNode(n *nodeView) openapi.Node {
	s, sp := n.obj.Status, n.obj.Spec
	out := openapi.Node{
		Name: n.obj.Name, Live: n.live, Health: string(s.Health),
		Cordoned: sp.Cordoned, Draining: sp.Draining,
		Capacity: apiCapacity(s.Capacity), Allocated: apiCapacity(s.Allocated), Free: apiCapacity(s.Free),
		Sandboxes: s.Sandboxes,
	}
	if s.HealthMessage != "" {
		out.HealthMessage = &s.HealthMessage
	}
	if sp.DrainDeadline != nil {
		t := sp.DrainDeadline.UTC()
		out.DrainDeadline = &t
	}
	if d := s.Drain; d != nil {
		out.Drain = &openapi.NodeDrain{Remaining: d.Remaining, Drained: d.Drained}
		if d.Deadline != nil {
			t := d.Deadline.UTC()
			out.Drain.Deadline = &t
		}
		if d.Deleted != 0 {
			out.Drain.Deleted = &d.Deleted
		}
	}
	if s.Address != "" {
		out.Address = &s.Address
	}
	if s.Version != "" {
		out.Version = &s.Version
	}
	if s.UpdatedAt != nil {
		t := s.UpdatedAt.UTC()
		out.UpdatedAt = &t
	}
	if !n.renewed.IsZero() {
		t := n.renewed.UTC()
		secs := int32(n.leaseFor / time.Second) //nolint:gosec // a lease lasts seconds to minutes
		out.LeaseRenewedAt, out.LeaseDurationSeconds = &t, &secs
	}
	return out
}

func apiCapacity(c v1alpha1.Capacity) openapi.NodeCapacity {
	return openapi.NodeCapacity{MemoryMb: c.MemoryMB, MilliCPU: c.MilliCPU, Sandboxes: c.Sandboxes}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
