package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// Sandboxes is what the node reads its sandboxes from: its supervisor.
type Sandboxes interface {
	List() ([]*supervisor.Status, error)
	Status(id string) (*supervisor.Status, error)
}

// Defaults of Config.
const (
	// The lease's timing is client-go's leader-election defaults, the timing Kubernetes'
	// own components use: a node that stops renewing is seen gone 15 s after its last renewal.
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	// DefaultStatusPeriod is how often the BothyNode's status is rewritten when nothing
	// changed, so that its UpdatedAt shows the node writing.
	DefaultStatusPeriod = 30 * time.Second
	// DefaultResync is how often every object is reconciled against the store again, for
	// what no event reported (an event missed while the API server was unreachable).
	DefaultResync = 5 * time.Minute
)

// Config configures a Node.
type Config struct {
	// Rest reaches the API server.
	Rest *rest.Config
	// Name is the node's name: its BothyNode's and its Lease's. It must be unique in the
	// cluster, like a kubelet's.
	Name string
	// Namespace holds the Sandbox objects and the Lease.
	Namespace string
	// Address is the URL of the node's API that routers send its sandboxes' calls to.
	Address string
	// Version is bothyd's version, published in the status.
	Version string
	// Sandboxes are the node's sandboxes.
	Sandboxes Sandboxes
	// Capacity is what the node offers sandboxes in all.
	Capacity v1alpha1.Capacity
	// Health is the node's verdict on itself and why; nil: always healthy.
	Health func() (v1alpha1.NodeHealth, string)
	// Create makes the sandbox a Sandbox object placed on this node asks for, as the node's
	// REST API would make it from the same request, and says the state it is in. It is
	// called only for an object whose sandbox does not exist, and the object's name is the
	// sandbox's id, so a create the node repeats after a crash finds the sandbox made and
	// makes no second one. Nil: the node makes no sandbox from an object.
	Create func(ctx context.Context, obj *v1alpha1.Sandbox) (v1alpha1.SandboxState, error)
	// Delete deletes a sandbox whose object is being deleted (kubectl delete), running or
	// not, as the REST API's forced delete does. Nil: the node deletes no sandbox for an
	// object, and leaves such an object's finalizer in place.
	Delete func(ctx context.Context, id string) error
	// CrashPoint, when set (a bothyd built for the crash tests), is called at the named steps
	// so that a test can kill the node there: "object-sandbox-made", after the sandbox an
	// object asks for is made and before the object says so.
	CrashPoint func(step string)
	// Images and Generations are what the node holds, for placement; nil: none.
	// Generations lists the newest first: a node holding more than the status's bound
	// publishes its newest. The status is rewritten after every supervisor event (a capture,
	// a tombstone, a retirement) and after [Node.GenerationsChanged] (a pull).
	Images      func() []string
	Generations func() []v1alpha1.Generation
	// Volumes are the names of the node's volumes, for routing their calls and placing the
	// sandboxes that mount them; nil: none.
	Volumes func() []string
	// Secrets are the names of the node's secrets (never a value), for placing the
	// sandboxes that bind them; nil: none. The status is rewritten after
	// [Node.SecretsChanged].
	Secrets func() []string
	// The lease's timing; the defaults when zero.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// StatusPeriod and Resync; the defaults when zero.
	StatusPeriod, Resync time.Duration
	Logger               *slog.Logger
}

// Node mirrors a bothyd's sandboxes and its own state into the cluster's objects.
type Node struct {
	cfg    Config
	c      client.Client
	log    *slog.Logger
	owner  client.FieldOwner
	queue  workqueue.TypedRateLimitingInterface[string]
	status chan struct{} // a status rewrite is wanted
	// admission enforces the published capacity on the node's own creates; claims claims
	// a create's id in the cluster before it (claim.go).
	admission *Admission
	claims    *claimingAdmission
	// drainState is the operator's spec as last read, and the drain's progress (drain.go).
	drainState *drainState
	// startID names this process in its status and its lease (StartLabel); published is
	// closed once the status naming it is written, before the lease is taken.
	startID   string
	published chan struct{}

	mu      sync.Mutex
	started bool
}

// New checks cfg and makes a Node; Run starts it.
func New(cfg Config) (*Node, error) {
	if cfg.Rest == nil || cfg.Name == "" || cfg.Namespace == "" || cfg.Sandboxes == nil {
		return nil, errors.New("cluster node: the API server's configuration, the node's name, the namespace and the sandboxes are required")
	}
	defaults := []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&cfg.LeaseDuration, DefaultLeaseDuration}, {&cfg.RenewDeadline, DefaultRenewDeadline},
		{&cfg.RetryPeriod, DefaultRetryPeriod}, {&cfg.StatusPeriod, DefaultStatusPeriod}, {&cfg.Resync, DefaultResync},
	}
	for _, d := range defaults {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := NewClient(cfg.Rest)
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg:   cfg,
		c:     c,
		log:   cfg.Logger.With("node", cfg.Name),
		owner: client.FieldOwner("bothy-node"),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "bothy-node-sandboxes"}),
		status:     make(chan struct{}, 1),
		admission:  NewAdmission(cfg.Capacity, cfg.Sandboxes.List),
		drainState: newDrainState(),
		startID:    rand.Text(),
		published:  make(chan struct{}),
	}
	n.claims = newClaimingAdmission(n, n.admission)
	return n, nil
}

// Admission is what the node's supervisor asks before each create
// (supervisor.Options.CreateAdmission): nil for a nil Node (a server not in node mode).
func (n *Node) Admission() supervisor.CreateAdmission {
	if n == nil {
		return nil
	}
	return n.claims
}

// NewClient is a controller-runtime client that knows the cluster's types and the built-in
// ones (the Lease).
func NewClient(cfg *rest.Config) (client.Client, error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// Scheme knows the cluster's types and the built-in ones.
func Scheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// OnEvent is the supervisor's event hook: it queues the sandbox the event is about for its
// object to be brought up to date, and the node's status for a rewrite. It never blocks, so
// the supervisor's transitions never wait on the API server. A nil Node (a server not in
// node mode) ignores the event.
func (n *Node) OnEvent(e supervisor.Event) {
	if n == nil {
		return
	}
	if e.Sandbox != "" {
		n.queue.Add(e.Sandbox)
	}
	n.wantStatus()
}

// GenerationsChanged asks for the node's status to be rewritten because the generations it
// holds changed without a supervisor event (a pull from the template registry). A nil Node
// ignores it.
func (n *Node) GenerationsChanged() {
	if n == nil {
		return
	}
	n.wantStatus()
}

// SecretsChanged asks for the node's status to be rewritten because a secret was created or
// deleted: a router places a sandbox that binds a secret only on a node that lists it. A nil
// Node ignores it.
func (n *Node) SecretsChanged() {
	if n == nil {
		return
	}
	n.wantStatus()
}

func (n *Node) wantStatus() {
	select {
	case n.status <- struct{}{}:
	default:
	}
}

// Run holds the node's lease, publishes its status and mirrors its sandboxes until ctx
// ends. It reconciles every object against the store before it follows events.
func (n *Node) Run(ctx context.Context) error {
	n.mu.Lock()
	if n.started {
		n.mu.Unlock()
		return errors.New("cluster node: Run called twice")
	}
	n.started = true
	n.mu.Unlock()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer n.queue.ShutDown()
	wg.Add(5)
	go func() { defer wg.Done(); n.holdLease(ctx) }()
	go func() { defer wg.Done(); n.watchSpec(ctx) }()
	go func() { defer wg.Done(); n.publishStatus(ctx) }()
	go func() { defer wg.Done(); n.mirror(ctx) }()
	go func() { defer wg.Done(); n.watchObjects(ctx) }()
	<-ctx.Done()
	return nil
}

// mirror reconciles at start-up and on every resync, and between them brings each queued
// sandbox's object up to date, one at a time.
func (n *Node) mirror(ctx context.Context) {
	go func() {
		for {
			if err := n.Reconcile(ctx); err != nil && ctx.Err() == nil {
				n.log.Warn("cluster: reconciling the sandboxes' objects failed; retrying", "err", err)
				if !sleep(ctx, n.cfg.RetryPeriod) {
					return
				}
				continue
			}
			if !sleep(ctx, n.cfg.Resync) {
				return
			}
		}
	}()
	go func() {
		<-ctx.Done()
		n.queue.ShutDown()
	}()
	for {
		id, shutdown := n.queue.Get()
		if shutdown {
			return
		}
		err := n.sync(ctx, id)
		switch {
		case err == nil:
			n.queue.Forget(id)
		case ctx.Err() != nil:
		case apierrors.IsInvalid(err):
			// The API server will refuse it again: an id Kubernetes cannot name (one that
			// ends with '-'). Retrying would only repeat the line; the next event retries.
			n.log.Warn("cluster: the API server refuses this sandbox's object; it has none", "sandbox", id, "err", err)
			n.queue.Forget(id)
		default:
			n.log.Warn("cluster: updating a sandbox's object failed; retrying", "sandbox", id, "err", err)
			n.queue.AddRateLimited(id)
		}
		n.queue.Done(id)
	}
}

// Reconcile brings the objects in line with the store: every sandbox gets an object that
// reads as the node does, and every object of this node's without a sandbox is queued: one
// placed here and never made gets its sandbox, any other is removed (sync).
// Exported for the node's tests and for `bothyd check`-style tooling.
func (n *Node) Reconcile(ctx context.Context) error {
	var objs v1alpha1.SandboxList
	if err := n.c.List(ctx, &objs, client.InNamespace(n.cfg.Namespace), client.MatchingLabels{v1alpha1.NodeLabel: n.cfg.Name}); err != nil {
		return fmt.Errorf("listing the node's Sandbox objects: %w", err)
	}
	sandboxes, err := n.cfg.Sandboxes.List()
	if err != nil {
		return fmt.Errorf("listing the node's sandboxes: %w", err)
	}
	have := make(map[string]bool, len(sandboxes))
	for _, st := range sandboxes {
		have[st.Config.ID] = true
		n.queue.Add(st.Config.ID)
	}
	removed := 0
	for i := range objs.Items {
		obj := &objs.Items[i]
		if have[obj.Name] {
			continue
		}
		// Not in the store: queued, the sync makes its sandbox (placed here, never made) or
		// removes the object (its sandbox is gone).
		n.queue.Add(obj.Name)
		removed++
	}
	n.log.Info("cluster: reconciling the sandboxes' objects", "sandboxes", len(sandboxes), "objects", len(objs.Items), "objects_without_sandbox", removed)
	n.wantStatus()
	return nil
}

// sync makes id's object and id's sandbox agree, the node's store being the authority
// (docs/cluster.md, "Sandbox objects made with kubectl"):
//
//   - an object of this node's being deleted: its sandbox is deleted, then its finalizer
//     removed, so the object goes only once the sandbox has;
//   - a sandbox: its object is applied as the node reads it (with the finalizer);
//   - no sandbox, and an object placed on this node whose status names no node yet: the
//     object asks for a sandbox that was never made here; it is made;
//   - no sandbox, and any other object of this node's: the sandbox was deleted (through the
//     REST API, or by its lifetime); the object is removed.
func (n *Node) sync(ctx context.Context, id string) error {
	if n.claims.creating(id) {
		return nil // its claim stands while the create runs; the create's end queues it again
	}
	st, err := n.cfg.Sandboxes.Status(id)
	// An object whose name is no valid id holds no sandbox of this node's either.
	missing := false
	if code := errcode.Of(err); code == errcode.SandboxNotFound || code == errcode.InvalidRequest {
		missing, err = true, nil
	}
	if err != nil {
		return err
	}
	// Read from the API server, not a cache: what follows acts on what the object says.
	var cur v1alpha1.Sandbox
	owner := ""
	switch err := n.c.Get(ctx, client.ObjectKey{Namespace: n.cfg.Namespace, Name: id}, &cur); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	default:
		owner = cur.Labels[v1alpha1.NodeLabel]
	}
	// Refuse to take over another node's object: two sandboxes of one id on two nodes is a
	// conflict for the operator (or the router that placed them) to settle, not for a node to
	// win by writing last.
	if owner != "" && owner != n.cfg.Name {
		if !missing {
			n.log.Warn("cluster: a Sandbox object of this id belongs to another node; leaving it alone", "sandbox", id, "owner", owner)
		}
		return nil
	}
	mine := owner == n.cfg.Name
	switch {
	case mine && cur.DeletionTimestamp != nil:
		return n.deleted(ctx, &cur, !missing)
	case missing && mine && cur.Annotations[v1alpha1.PlacedAnnotation] == n.cfg.Name && cur.Status.Node == "" && n.cfg.Create != nil:
		return n.create(ctx, &cur)
	case missing && mine:
		return n.remove(ctx, &cur)
	case missing:
		return nil
	}
	return n.apply(ctx, st)
}

// deleted deletes the sandbox of cur, an object of this node's being deleted, if it has
// one, and then lets the object go.
func (n *Node) deleted(ctx context.Context, cur *v1alpha1.Sandbox, hasSandbox bool) error {
	if hasSandbox {
		if n.cfg.Delete == nil {
			return nil
		}
		if err := n.cfg.Delete(ctx, cur.Name); err != nil && errcode.Of(err) != errcode.SandboxNotFound {
			return fmt.Errorf("deleting the sandbox of a deleted Sandbox object: %w", err)
		}
		n.log.Info("cluster: deleted the sandbox of a deleted Sandbox object", "sandbox", cur.Name)
	}
	return n.dropFinalizer(ctx, cur)
}

// apply server-side applies st's object and its status as the node.
func (n *Node) apply(ctx context.Context, st *supervisor.Status) error {
	obj := n.object(st)
	u, err := toApply(obj, false)
	if err != nil {
		return err
	}
	if err := n.c.Patch(ctx, u, client.Apply, n.owner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying the Sandbox object: %w", err)
	}
	u, err = toApply(obj, true)
	if err != nil {
		return err
	}
	if err := n.c.Status().Patch(ctx, u, client.Apply, n.owner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying the Sandbox object's status: %w", err)
	}
	return nil
}

// create makes the sandbox obj asks for, then writes the node and the state the create
// returned into obj's status at once. From that write on the object reads as made here: if
// the sandbox is deleted (through the REST API) before the next sync, that sync removes the
// object rather than making the sandbox again. (The state comes from the create itself, not
// a read after it, for the same reason: a read could already find the sandbox deleted.)
func (n *Node) create(ctx context.Context, obj *v1alpha1.Sandbox) error {
	state, err := n.cfg.Create(ctx, obj)
	if err != nil && errcode.Of(err) != errcode.AlreadyProvisioned {
		// Said in the object, for whoever made it; retried with backoff, since a full node
		// or a missing image may change.
		msg := "The node could not create this sandbox: " + err.Error()
		if len(msg) > 1024 {
			msg = msg[:1024]
		}
		if werr := n.writeStatus(ctx, obj.Name, map[string]any{"message": msg}); werr != nil {
			n.log.Warn("cluster: writing why a sandbox could not be made", "sandbox", obj.Name, "err", werr)
		}
		return fmt.Errorf("creating the sandbox a Sandbox object asks for: %w", err)
	}
	if err != nil {
		// Made already (by this node before a crash, or through the REST API): mirror it.
		st, serr := n.cfg.Sandboxes.Status(obj.Name)
		if serr != nil {
			return serr
		}
		state = v1alpha1.SandboxState(st.State)
	}
	n.log.Info("cluster: made the sandbox a Sandbox object asks for", "sandbox", obj.Name, "state", state)
	if n.cfg.CrashPoint != nil {
		n.cfg.CrashPoint("object-sandbox-made")
	}
	now := metav1.Now()
	return n.writeStatus(ctx, obj.Name, map[string]any{"node": n.cfg.Name, "state": string(state), "observedAt": now.UTC().Format(time.RFC3339)})
}

// writeStatus server-side applies fields of name's status as the node.
func (n *Node) writeStatus(ctx context.Context, name string, fields map[string]any) error {
	u := &unstructured.Unstructured{Object: map[string]any{"status": fields}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind("Sandbox")
	u.SetNamespace(n.cfg.Namespace)
	u.SetName(name)
	return n.c.Status().Patch(ctx, u, client.Apply, n.owner, client.ForceOwnership)
}

// remove deletes cur, an object of this node's whose sandbox is gone, and its finalizer.
func (n *Node) remove(ctx context.Context, cur *v1alpha1.Sandbox) error {
	// Delete exactly the object read, so a newer one of the same name is never removed.
	err := n.c.Delete(ctx, cur, client.Preconditions{UID: &cur.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	// Held by the finalizer: read it again (its version changed) and let it go.
	var again v1alpha1.Sandbox
	if err := n.c.Get(ctx, client.ObjectKeyFromObject(cur), &again); err != nil {
		return client.IgnoreNotFound(err)
	}
	if again.UID != cur.UID {
		return nil
	}
	return n.dropFinalizer(ctx, &again)
}

// dropFinalizer removes the node's finalizer from cur, sent with the version read, so that a
// change since is read again (the work queue retries) rather than overwritten.
func (n *Node) dropFinalizer(ctx context.Context, cur *v1alpha1.Sandbox) error {
	if !slices.Contains(cur.Finalizers, v1alpha1.Finalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(cur.DeepCopy(), client.MergeFromWithOptimisticLock{})
	cur.Finalizers = slices.DeleteFunc(cur.Finalizers, func(f string) bool { return f == v1alpha1.Finalizer })
	return client.IgnoreNotFound(n.c.Patch(ctx, cur, patch))
}

// object is the Sandbox object that says what the node knows of st.
func (n *Node) object(st *supervisor.Status) *v1alpha1.Sandbox {
	cfg := st.Config
	now := metav1.Now()
	obj := &v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{
			Name: cfg.ID, Namespace: n.cfg.Namespace,
			Labels:     map[string]string{v1alpha1.NodeLabel: n.cfg.Name},
			Finalizers: []string{v1alpha1.Finalizer},
		},
		Spec: v1alpha1.SandboxSpec{
			Image:   cfg.Image,
			Runtime: st.Runtime,
			Resources: v1alpha1.Resources{
				VCPUs: int32(cfg.Resources.VCPUs), MemoryMB: int32(cfg.Resources.MemoryMB), //nolint:gosec // limits validated far below 2^31
				Pids: int32(cfg.Resources.Pids), DiskMB: int32(cfg.DiskMB), //nolint:gosec // as above
			},
			Internet: cfg.Network != nil && cfg.Network.Internet,
			Labels:   cfg.Labels,
			NodeName: n.cfg.Name,
		},
		Status: v1alpha1.SandboxStatus{
			Node:       n.cfg.Name,
			State:      v1alpha1.SandboxState(st.State),
			Asleep:     st.Asleep,
			StartedAt:  metaTime(st.StartedAt),
			ExpiresAt:  metaTime(st.ExpiresAt),
			ObservedAt: &now,
		},
	}
	if cfg.Template != nil {
		obj.Spec.Template = &v1alpha1.TemplateRef{Template: cfg.Template.Template, Generation: cfg.Template.Generation}
	}
	if st.LastExit != nil {
		code := int32(st.LastExit.ExitCode) //nolint:gosec // an exit code fits
		obj.Status.ExitCode = &code
	}
	return obj
}

func metaTime(t *time.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	mt := metav1.NewTime(*t)
	return &mt
}

// toApply is obj as a server-side apply body: the object without its status, or (status
// set) the status alone. A typed object would also send creationTimestamp: null, which
// would make this node a manager of a field it never sets.
func toApply(obj client.Object, status bool) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	if status {
		unstructured.RemoveNestedField(u.Object, "spec")
		unstructured.RemoveNestedField(u.Object, "metadata", "labels")
		unstructured.RemoveNestedField(u.Object, "metadata", "finalizers")
	} else {
		unstructured.RemoveNestedField(u.Object, "status")
	}
	return u, nil
}

// sleep waits d or until ctx ends, and says whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
