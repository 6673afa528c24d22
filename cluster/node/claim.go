package node

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// An id is the cluster's, not one node's: two creates of one new id that two routers place
// on two nodes at the same instant must not both succeed (docs/cluster.md, "A sandbox's id
// is claimed in the cluster"). A node therefore claims the id before it makes the sandbox:
// it creates the id's Sandbox object, labelled with its own name, and the API server, which
// takes one create of a name, decides between the two nodes. The loser answers
// already-provisioned, naming the node that holds the id. The claim is recorded before the
// sandbox is made, so a crash between the two leaves an object of this node's without a
// sandbox, which the node's reconcile at start-up removes like any other; and the node's own
// watch leaves a claim alone while its create runs (inFlight), so the object is not removed
// under the create.

// claimTimeout bounds the claim's call to the API server.
const claimTimeout = 5 * time.Second

// claimingAdmission is the node's CreateAdmission: the capacity's, then the id's claim.
type claimingAdmission struct {
	n        *Node
	capacity *Admission

	mu       sync.Mutex
	inFlight map[string]int
}

func newClaimingAdmission(n *Node, capacity *Admission) *claimingAdmission {
	return &claimingAdmission{n: n, capacity: capacity, inFlight: map[string]int{}}
}

// Admit admits id by capacity, then claims it for this node unless the node holds the
// sandbox already (a start of its own). Capacity first: a create refused for room
// (node-full, node-draining) is placed again on another node by the router, and must leave
// no claim behind. The release removes a claim this create made if the create made nothing,
// at once, so that the client's retry may go to another node; otherwise it lets the node's
// reconcile bring the object up to date.
func (a *claimingAdmission) Admit(id string, limits supervisor.Resources) (func(), error) {
	if _, err := a.n.cfg.Sandboxes.Status(id); err == nil {
		return a.capacity.Admit(id, limits)
	}
	release, err := a.capacity.Admit(id, limits)
	if err != nil {
		return nil, err
	}
	a.begin(id)
	made, err := a.n.claim(id)
	if err != nil {
		release()
		a.end(id)
		return nil, err
	}
	return func() {
		release()
		if made != nil {
			if _, err := a.n.cfg.Sandboxes.Status(id); errcode.Of(err) == errcode.SandboxNotFound {
				ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
				if err := a.n.remove(ctx, made); err != nil {
					a.n.log.Warn("cluster: removing the claim of a create that made nothing; the reconcile removes it", "sandbox", id, "err", err)
				}
				cancel()
			}
		}
		a.end(id)
	}, nil
}

func (a *claimingAdmission) begin(id string) {
	a.mu.Lock()
	a.inFlight[id]++
	a.mu.Unlock()
}

// end ends one create of id and queues the id, so that a claim whose create made nothing is
// removed and one whose create made the sandbox is brought up to date.
func (a *claimingAdmission) end(id string) {
	a.mu.Lock()
	if a.inFlight[id]--; a.inFlight[id] <= 0 {
		delete(a.inFlight, id)
	}
	a.mu.Unlock()
	a.n.queue.Add(id)
}

// creating reports whether a create of id runs on this node now.
func (a *claimingAdmission) creating(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight[id] > 0
}

// claim makes id's Sandbox object, labelled with this node's name, or finds it made: the
// node's own (an object kubectl made and the controller placed here, or a claim of an
// earlier try) is the node's to use; another node's, or one no node has taken yet (kubectl's,
// before the controller places it), refuses the create. An API server that cannot be reached
// does not stop the node: the create goes on unclaimed, as it did before claims (logged),
// since a node must keep making sandboxes while the control plane is away; the cluster-wide
// check reports a double that this lets through.
//
// It returns the object it made, nil when it found one of its own or went on unclaimed.
func (n *Node) claim(id string) (*v1alpha1.Sandbox, error) {
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	var cur v1alpha1.Sandbox
	for attempt := 0; ; attempt++ {
		obj := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{
			Namespace: n.cfg.Namespace, Name: id,
			Labels:     map[string]string{v1alpha1.NodeLabel: n.cfg.Name},
			Finalizers: []string{v1alpha1.Finalizer},
		}}
		err := n.c.Create(ctx, obj, n.owner)
		switch {
		case err == nil:
			return obj, nil
		case apierrors.IsInvalid(err):
			return nil, nil // no valid object name: the create refuses the id itself (invalid-request)
		case !apierrors.IsAlreadyExists(err):
			n.log.Warn("cluster: the id could not be claimed in the API server; creating the sandbox unclaimed", "sandbox", id, "err", err)
			return nil, nil
		}
		err = n.c.Get(ctx, client.ObjectKey{Namespace: n.cfg.Namespace, Name: id}, &cur)
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || attempt >= 2 {
			n.log.Warn("cluster: the id's object could not be read; creating the sandbox unclaimed", "sandbox", id, "err", err)
			return nil, nil
		}
		// Removed between the create and the read: claim it again.
	}
	switch owner := cur.Labels[v1alpha1.NodeLabel]; {
	case owner == n.cfg.Name && cur.DeletionTimestamp == nil:
		return nil, nil
	case owner == n.cfg.Name:
		return nil, errcode.New(errcode.AlreadyProvisioned, "A sandbox %s was just deleted on this node and its object is still going; retry in a moment.", id)
	case owner == "":
		return nil, errcode.New(errcode.AlreadyProvisioned, "The cluster holds a Sandbox object %s that no node has made yet (made with kubectl); choose another id, or delete that object.", id)
	default:
		return nil, errcode.New(errcode.AlreadyProvisioned, "A sandbox %s is on node %s of the cluster; choose another id.", id, owner)
	}
}
