// Package audit is the cluster-wide consistency check (`bothyd check --cluster`,
// docs/cluster.md): it compares the Sandbox objects with the sandboxes every live node holds,
// read through the nodes' own API, and reports each disagreement — an object without its
// sandbox, a sandbox without an object, an object whose node or state is not the sandbox's,
// an id on two nodes — and each secret that some live nodes hold and others do not (by the
// names in their BothyNodes' status, never a value). With Repair it does what the node's own reconcile does for each: the
// node's store is the authority, so the object is written as the node reads (as the node's
// field manager) or removed; it never changes a sandbox. An id on two nodes is left to the
// operator, and so is a secret missing on some nodes (the check holds no value: a rotate
// through the router writes it on every live node).
//
// It must not judge a node it cannot read: the objects of a node whose lease has lapsed are
// counted, not checked.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
)

// The kinds of disagreement.
const (
	ObjectWithoutSandbox = "object-without-sandbox"
	SandboxWithoutObject = "sandbox-without-object"
	NodeMismatch         = "node-mismatch"
	StateMismatch        = "state-mismatch"
	OnTwoNodes           = "on-two-nodes"
	// SecretNotEverywhere: live nodes list a secret that other live nodes do not.
	SecretNotEverywhere = "secret-not-everywhere"
)

// Options configure a check.
type Options struct {
	// Client reads (and, with Repair, writes) the Sandbox, BothyNode and Lease objects.
	Client    client.Client
	Namespace string
	// NodeToken is what the check presents to the nodes' API.
	NodeToken string
	// HTTP reaches the nodes; a client with a 30 s timeout when nil.
	HTTP *http.Client
	// Repair writes each object as its node reads it, or removes it.
	Repair bool
	// Settle is how long a disagreement must last to count: the check reads twice, Settle
	// apart, and reports only what both reads saw, so that a sandbox changing while it reads
	// (its node mirrors it within a second) is no false alarm. Zero: 2 s.
	Settle time.Duration
}

// Problem is one disagreement.
type Problem struct {
	Kind    string `json:"kind"`
	Sandbox string `json:"sandbox"`
	// Secret is the secret's name, for SecretNotEverywhere (whose Sandbox is empty).
	Secret string `json:"secret,omitempty"`
	// Node is the node that holds the sandbox, or that the object names.
	Node   string `json:"node,omitempty"`
	Detail string `json:"detail"`
	// Repaired says Repair fixed it.
	Repaired bool `json:"repaired,omitempty"`
}

func (p Problem) String() string {
	subject := p.Sandbox
	if p.Secret != "" {
		subject = "secret " + p.Secret
	}
	s := fmt.Sprintf("%s %s: %s", p.Kind, subject, p.Detail)
	if p.Repaired {
		s += " (repaired)"
	}
	return s
}

// Report is a check's result.
type Report struct {
	Nodes     int `json:"nodes"`
	LiveNodes int `json:"live_nodes"`
	Objects   int `json:"objects"`
	Sandboxes int `json:"sandboxes"`
	// Unverified counts the objects of nodes whose lease has lapsed, and objects placed on a
	// node that has not made their sandbox yet.
	Unverified int       `json:"unverified"`
	Problems   []Problem `json:"problems"`
	// Remaining counts the problems not repaired.
	Remaining int `json:"remaining"`
}

// OK says nothing disagrees (or all was repaired).
func (r *Report) OK() bool { return r.Remaining == 0 }

// sandbox is what a node's API says of one of its sandboxes.
type sandbox struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// view is one read of the cluster.
type view struct {
	nodes     map[string]v1alpha1.BothyNode
	live      map[string]bool
	objects   map[string]v1alpha1.Sandbox
	sandboxes map[string]map[string]sandbox // id → node → sandbox
	count     int
}

// Run checks the cluster.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Client == nil || o.Namespace == "" {
		return nil, errors.New("audit: a client and a namespace are required")
	}
	if o.HTTP == nil {
		o.HTTP = &http.Client{Timeout: 30 * time.Second}
	}
	if o.Settle == 0 {
		o.Settle = 2 * time.Second
	}
	first, err := read(ctx, o)
	if err != nil {
		return nil, err
	}
	found := compare(first)
	if len(found) > 0 {
		// Read again: only what lasts counts.
		t := time.NewTimer(o.Settle)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		again, err := read(ctx, o)
		if err != nil {
			return nil, err
		}
		before := map[string]bool{}
		for _, p := range found {
			before[p.key()] = true
		}
		found = found[:0]
		for _, p := range compare(again) {
			if before[p.key()] {
				found = append(found, p)
			}
		}
		first = again
	}
	rep := &Report{Nodes: len(first.nodes), Objects: len(first.objects), Sandboxes: first.count, Problems: []Problem{}}
	for _, l := range first.live {
		if l {
			rep.LiveNodes++
		}
	}
	for _, obj := range first.objects {
		if owner := objectNode(&obj); owner == "" || !first.live[owner] || obj.Status.Node == "" {
			rep.Unverified++
		}
	}
	for _, p := range found {
		if o.Repair {
			if err := repair(ctx, o, first, &p); err != nil {
				p.Detail += " (repair failed: " + err.Error() + ")"
			}
		}
		if !p.Repaired {
			rep.Remaining++
		}
		rep.Problems = append(rep.Problems, p)
	}
	return rep, nil
}

// key names what p is about, for telling the same problem in two reads.
func (p Problem) key() string { return p.Kind + "/" + p.Sandbox + "/" + p.Secret }

// objectNode is the node an object belongs to: its label (the node writes it first), else
// its status.
func objectNode(obj *v1alpha1.Sandbox) string {
	if n := obj.Labels[v1alpha1.NodeLabel]; n != "" {
		return n
	}
	return obj.Status.Node
}

// read reads the objects and every live node's sandboxes.
func read(ctx context.Context, o Options) (*view, error) {
	v := &view{nodes: map[string]v1alpha1.BothyNode{}, live: map[string]bool{}, objects: map[string]v1alpha1.Sandbox{}, sandboxes: map[string]map[string]sandbox{}}
	var nodes v1alpha1.BothyNodeList
	if err := o.Client.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("listing the BothyNodes: %w", err)
	}
	var leases coordinationv1.LeaseList
	if err := o.Client.List(ctx, &leases, client.InNamespace(o.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the nodes' Leases: %w", err)
	}
	now := time.Now()
	started := map[string]string{} // a node's status's start id
	for _, n := range nodes.Items {
		started[n.Name] = n.Status.StartID
	}
	for _, l := range leases.Items {
		name, ok := strings.CutPrefix(l.Name, node.LeasePrefix)
		if !ok || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name {
			continue
		}
		// As a router judges it: a lease renewed by a process whose status is not read yet
		// (a node restarting) has not published its address, so the node cannot be read.
		id, labelled := l.Labels[node.StartLabel]
		v.live[name] = node.LeaseLive(l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, now) &&
			(!labelled || id == started[name])
	}
	// The objects before the nodes: a sandbox made in between is then seen by the node and
	// not the object, which the second read settles.
	var objs v1alpha1.SandboxList
	if err := o.Client.List(ctx, &objs, client.InNamespace(o.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the Sandbox objects: %w", err)
	}
	for _, obj := range objs.Items {
		v.objects[obj.Name] = obj
	}
	for _, n := range nodes.Items {
		v.nodes[n.Name] = n
		if !v.live[n.Name] {
			continue
		}
		list, err := nodeSandboxes(ctx, o, n)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, sb := range list {
			if v.sandboxes[sb.ID] == nil {
				v.sandboxes[sb.ID] = map[string]sandbox{}
			}
			v.sandboxes[sb.ID][n.Name] = sb
			v.count++
		}
	}
	return v, nil
}

// nodeSandboxes lists every sandbox of node n through its API, page by page.
func nodeSandboxes(ctx context.Context, o Options, n v1alpha1.BothyNode) ([]sandbox, error) {
	base, err := url.Parse(n.Status.Address)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("it publishes the address %q, which is no http(s) URL", n.Status.Address)
	}
	var out []sandbox
	cursor := ""
	for {
		u := *base
		u.Path = "/v1/sandboxes"
		q := url.Values{"limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		u.RawQuery = q.Encode()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return nil, err
		}
		if o.NodeToken != "" {
			req.Header.Set("Authorization", "Bearer "+o.NodeToken)
		}
		resp, err := o.HTTP.Do(req) //nolint:gosec // G704: the node's published address, read by the operator's own credentials
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("its list answered %d: %.200s", resp.StatusCode, body)
		}
		var page struct {
			Items      []sandbox `json:"items"`
			NextCursor string    `json:"next_cursor"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, fmt.Errorf("its list: %w", err)
		}
		out = append(out, page.Items...)
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

// compare lists the disagreements of one read, in id order.
func compare(v *view) []Problem {
	var out []Problem
	for id, on := range v.sandboxes {
		names := make([]string, 0, len(on))
		for name := range on {
			names = append(names, name)
		}
		sort.Strings(names)
		if len(names) > 1 {
			out = append(out, Problem{Kind: OnTwoNodes, Sandbox: id, Node: strings.Join(names, ","), Detail: "a sandbox of this id is on nodes " + strings.Join(names, " and ") + "; the operator must delete one"})
			continue
		}
		name, sb := names[0], on[names[0]]
		obj, ok := v.objects[id]
		switch {
		case !ok:
			out = append(out, Problem{Kind: SandboxWithoutObject, Sandbox: id, Node: name, Detail: "node " + name + " holds it and no Sandbox object names it"})
		case objectNode(&obj) != name || (obj.Status.Node != "" && obj.Status.Node != name):
			out = append(out, Problem{Kind: NodeMismatch, Sandbox: id, Node: name, Detail: fmt.Sprintf("it is on node %s and its object names node %q", name, objectNode(&obj))})
		case obj.DeletionTimestamp != nil:
			// Being deleted: its node deletes the sandbox, then lets the object go.
		case obj.Status.Node == "":
			// Placed and being made: the node writes its status next.
		case string(obj.Status.State) != sb.State:
			out = append(out, Problem{Kind: StateMismatch, Sandbox: id, Node: name, Detail: fmt.Sprintf("node %s says %s, its object %q", name, sb.State, obj.Status.State)})
		}
	}
	for id, obj := range v.objects {
		owner := objectNode(&obj)
		if _, held := v.sandboxes[id]; held || owner == "" || !v.live[owner] || obj.Status.Node == "" {
			// Held (judged above), requested, on a node that cannot be read, or placed and
			// not made yet: nothing to compare.
			continue
		}
		out = append(out, Problem{Kind: ObjectWithoutSandbox, Sandbox: id, Node: owner, Detail: "its object names node " + owner + ", which holds no such sandbox"})
	}
	out = append(out, secretsApart(v)...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Sandbox != out[j].Sandbox {
			return out[i].Sandbox < out[j].Sandbox
		}
		if out[i].Secret != out[j].Secret {
			return out[i].Secret < out[j].Secret
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

// secretsApart reports each secret that some live nodes list in their BothyNode's
// status.secrets and other live nodes do not: the router writes a secret on every live node,
// so one missing is a node that was lost or not yet joined when it was created (or a write
// that failed there). A sandbox that binds it is placed only on its holders. A lost node's
// list is not judged: it was not written while lost, and the router says so.
func secretsApart(v *view) []Problem {
	var live []string
	holders := map[string][]string{}
	for name, n := range v.nodes {
		if !v.live[name] {
			continue
		}
		live = append(live, name)
		for _, s := range n.Status.Secrets {
			holders[s] = append(holders[s], name)
		}
	}
	sort.Strings(live)
	var out []Problem
	for secret, on := range holders {
		if len(on) == len(live) {
			continue
		}
		sort.Strings(on)
		var lacking []string
		for _, name := range live {
			if !slices.Contains(on, name) {
				lacking = append(lacking, name)
			}
		}
		out = append(out, Problem{Kind: SecretNotEverywhere, Secret: secret, Node: strings.Join(lacking, ","),
			Detail: fmt.Sprintf("live nodes %s hold it and %s do not, so sandboxes that bind it go to its holders only; rotate it through the router (bothy secret rotate %s, or POST /v1/secrets/%s/rotate with its value) to write it on every live node, or delete it through the router", strings.Join(on, ", "), strings.Join(lacking, ", "), secret, secret)})
	}
	return out
}

// fieldOwner is the check's own field manager: a repair takes only the fields it writes
// (forced), which the node's next write (forced too) takes back; writing as the node
// would drop every field of the node's that the repair leaves out.
const fieldOwner = client.FieldOwner("bothy-check")

// repair does for p what the node's reconcile does: the object is written as the node reads
// the sandbox, or removed when the node holds none.
func repair(ctx context.Context, o Options, v *view, p *Problem) error {
	switch p.Kind {
	case ObjectWithoutSandbox:
		obj := v.objects[p.Sandbox]
		// A delete of exactly the object read; its node's watch sees it going, finds no
		// sandbox and lets the finalizer go.
		err := o.Client.Delete(ctx, &obj, client.Preconditions{UID: &obj.UID})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	case SandboxWithoutObject, NodeMismatch, StateMismatch:
		sb := v.sandboxes[p.Sandbox][p.Node]
		meta := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
			"labels":     map[string]any{v1alpha1.NodeLabel: p.Node},
			"finalizers": []any{v1alpha1.Finalizer},
		}, "spec": map[string]any{"nodeName": p.Node}}}
		meta.SetAPIVersion(v1alpha1.GroupVersion.String())
		meta.SetKind("Sandbox")
		meta.SetNamespace(o.Namespace)
		meta.SetName(p.Sandbox)
		if err := o.Client.Patch(ctx, meta, client.Apply, fieldOwner, client.ForceOwnership); err != nil {
			return err
		}
		st := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{
			"node": p.Node, "state": sb.State, "observedAt": metav1.Now().UTC().Format(time.RFC3339),
		}}}
		st.SetAPIVersion(v1alpha1.GroupVersion.String())
		st.SetKind("Sandbox")
		st.SetNamespace(o.Namespace)
		st.SetName(p.Sandbox)
		if err := o.Client.Status().Patch(ctx, st, client.Apply, fieldOwner, client.ForceOwnership); err != nil {
			return err
		}
	default:
		return nil // an id on two nodes: the operator's
	}
	p.Repaired = true
	return nil
}
