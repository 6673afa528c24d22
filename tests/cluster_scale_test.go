package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/placement"
	"github.com/bothy/bothy/errcode"
)

// scaleNode is one of the suite's three nodes: a host of its own, as far as one machine can
// stand in for three — a network namespace with a veth link to the test's, an address on a
// private subnet its API listens on, its own state root — and what it offers.
type scaleNode struct {
	name   string
	ns     *os.File
	addr   netip.Addr
	slots  int
	memory int
	d      *daemon
}

// newScaleHost makes a network namespace joined to the test's by a veth pair (host side
// hostIP/24, the namespace's side nodeIP/24), with lo up, and a forwarder in it that carries
// connections to the API server's loopback port to the API server (which listens on the
// test's loopback only, with a certificate for 127.0.0.1), so that a node in the namespace
// reaches it at the same URL.
func newScaleHost(t *testing.T, i int, hostIP, nodeIP netip.Addr, apiserver string) *os.File {
	t.Helper()
	ns := newTestNS(t)
	h := nsHandle(t, ns)
	nsLinkUp(t, h, "lo")
	hostLink := fmt.Sprintf("bsc%dh%d", os.Getpid()%10000, i)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostLink}, PeerName: "eth0",
		PeerNamespace: netlink.NsFd(int(ns.Fd()))}); err != nil {
		t.Fatalf("a veth pair for node %d: %v", i, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostLink); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	root, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(root.Close)
	nsLinkUp(t, root, hostLink, netip.PrefixFrom(hostIP, 24))
	nsLinkUp(t, h, "eth0", netip.PrefixFrom(nodeIP, 24))

	var ln net.Listener
	if err := runInNS(ns, func() (err error) { ln, err = net.Listen("tcp4", apiserver); return err }); err != nil {
		t.Fatalf("the API server's forwarder in node %d's namespace: %v", i, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp4", apiserver) // from this goroutine: the test's namespace
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return ns
}

// TestClusterScale is issue 39's three-node suite: the real API server, three node bothyds
// each in a network namespace of its own (reached over veth links on a private subnet), two
// routers and two controllers. 300 sandboxes are made at once — 270 through both routers, 30
// as Sandbox objects the controllers place — on nodes whose capacities differ (slots bind on
// one, memory on the others), so the spread must follow the placement rule and no node may
// pass its limits; one router and the leading controller are SIGKILLed under that load, and
// no sandbox is lost or doubled. Then a node is SIGKILLed: its sandboxes read node-lost within
// the lease, and running again after its restart. The cluster-wide check ends clean. It logs
// the spread and creates per second through the routers beside a single node's, measured in
// the same run.
func TestClusterScale(t *testing.T) {
	requireRoot(t)
	began := time.Now()
	cp, admin, ctx := startInstalledCluster(t, 10*time.Minute, clusterNodeUser, clusterRouterUser, clusterControllerUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	const memoryMB, total, viaObjects = 64, 300, 30
	apiserver := strings.TrimPrefix(cp.URL, "https://")
	subnet := 100 + os.Getpid()%100
	nodes := []*scaleNode{
		{name: "scale-a", slots: 220, memory: 220 * memoryMB},
		{name: "scale-b", slots: 200, memory: 110 * memoryMB},
		{name: "scale-c", slots: 45, memory: 100 * memoryMB},
	}
	for i, n := range nodes {
		hostIP := netip.AddrFrom4([4]byte{10, byte(subnet), byte(i), 1})
		n.addr = netip.AddrFrom4([4]byte{10, byte(subnet), byte(i), 2})
		n.ns = newScaleHost(t, i, hostIP, n.addr, apiserver)
		n.d = startClusterNode(t, cp, admin, n.name, withToken(nodeToken), inNetNS(n.ns),
			withArgs("--listen", n.addr.String()+":0", "--cluster-max-sandboxes", fmt.Sprint(n.slots),
				"--cluster-memory-mb", fmt.Sprint(n.memory), "--cluster-cpu-overcommit", "1000"))
		if !strings.HasPrefix(n.d.URL, "http://"+n.addr.String()+":") {
			t.Fatalf("%s serves at %s, not in its namespace's address %s", n.name, n.d.URL, n.addr)
		}
	}
	routerURLs := make([]string, 2)
	routers := make([]*clusterProcess, 2)
	for i := range routers {
		routerURLs[i], routers[i] = startRouterProcess(t, cp, routerToken, nodeToken)
	}
	controllers := map[string]*clusterProcess{}
	for _, id := range []string{"ctl-1", "ctl-2"} {
		controllers[id] = startController(t, cp, id)
	}
	// Routers reach the nodes over the veths, not the nodes' loopback.
	for _, n := range nodes {
		var bn v1alpha1.BothyNode
		if err := admin.Get(ctx, client.ObjectKey{Name: n.name}, &bn); err != nil || bn.Status.Address != n.d.URL {
			t.Fatalf("%s publishes %q (%v), want %s", n.name, bn.Status.Address, err, n.d.URL)
		}
	}
	t.Logf("set up in %v", time.Since(began).Round(time.Millisecond))

	httpc := &http.Client{Timeout: 2 * time.Minute}
	create := func(base, token, id string) (int, string, error) {
		b, _ := json.Marshal(map[string]any{"id": id, "start": true, "resources": map[string]any{"memory_mb": memoryMB, "vcpus": 1}})
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/sandboxes", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}
	const workers = 8

	// A single node's creates per second, at the same concurrency, straight to scale-a's API:
	// the figure the cluster's stands beside. Deleted after.
	single := 40
	start := time.Now()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(single) {
					return
				}
				if status, body, err := create(nodes[0].d.URL, nodeToken, fmt.Sprintf("one-%03d", i)); err != nil || status != 201 {
					t.Errorf("a create on one node: %d %s %v", status, body, err)
				}
			}
		}()
	}
	wg.Wait()
	singleRate := float64(single) / time.Since(start).Seconds()
	for i := range single {
		if r := nodes[0].d.doJSON("DELETE", fmt.Sprintf("/v1/sandboxes/one-%03d?force=true", i), nil); r.Status != 204 {
			t.Fatalf("delete one-%03d: %d %s", i, r.Status, r.Body)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	waitCond(t, 30*time.Second, "scale-a empty again in its status", func() (bool, error) {
		var bn v1alpha1.BothyNode
		err := admin.Get(ctx, client.ObjectKey{Name: nodes[0].name}, &bn)
		return err == nil && bn.Status.Allocated.Sandboxes == 0, err
	})

	var leader string
	waitCond(t, 30*time.Second, "a controller leading", func() (bool, error) {
		var l coordinationv1.Lease
		err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: "bothy-controller"}, &l)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if l.Spec.HolderIdentity != nil && controllers[*l.Spec.HolderIdentity] != nil {
			leader = *l.Spec.HolderIdentity
		}
		return leader != "", err
	})

	// The load: 270 creates through both routers, 8 at a time, and 30 Sandbox objects made
	// meanwhile. After a third of the creates, router 0 and the leading controller die.
	viaRouters := total - viaObjects
	outcome := make([]string, viaRouters) // "made", "refused: …", "unknown: …"
	var done atomic.Int64
	var killedAt time.Time
	var routerDead atomic.Bool
	killOnce := sync.Once{}
	kill := func() {
		killOnce.Do(func() {
			killedAt = time.Now()
			routerDead.Store(true)
			_ = routers[0].cmd.Process.Kill()
			_ = controllers[leader].cmd.Process.Kill()
			t.Logf("SIGKILLed router 0 and the leading controller %s after %d creates", leader, done.Load())
		})
	}
	next.Store(0)
	start = time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(viaRouters) {
					return
				}
				// Workers alternate routers; once router 0 is dead, all go through router 1.
				r := w % 2
				if routerDead.Load() {
					r = 1
				}
				id := fmt.Sprintf("s-%03d", i)
				status, body, err := create(routerURLs[r], routerToken, id)
				switch {
				case err != nil:
					outcome[i] = "unknown: " + err.Error()
				case status == 201:
					outcome[i] = "made"
				default:
					outcome[i] = fmt.Sprintf("refused: %d %s", status, body)
				}
				if done.Add(1) == int64(viaRouters/3) {
					kill()
				}
			}
		}()
	}
	for i := range viaObjects {
		obj := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: fmt.Sprintf("k-%03d", i)},
			Spec: v1alpha1.SandboxSpec{Resources: v1alpha1.Resources{MemoryMB: memoryMB, VCPUs: 1}}}
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	routed := time.Since(start)
	made, unknown := 0, 0
	for i, o := range outcome {
		switch {
		case o == "made":
			made++
		case strings.HasPrefix(o, "unknown"):
			unknown++
		default:
			t.Errorf("s-%03d: %s", i, o)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	clusterRate := float64(made) / routed.Seconds()
	// What a client does with an answer lost with router 0: the same create again through
	// the other replica. The id is the cluster's, so the retry either makes the sandbox (the
	// first never reached a node) or reaches the node that made it, which answers
	// already-provisioned; never a second sandbox on another node.
	retriedMade, retriedHeld := 0, 0
	for i, o := range outcome {
		if !strings.HasPrefix(o, "unknown") {
			continue
		}
		id := fmt.Sprintf("s-%03d", i)
		status, body, err := create(routerURLs[1], routerToken, id)
		switch {
		case err != nil:
			t.Errorf("the retry of %s through router 1: %v", id, err)
		case status == 201:
			retriedMade++
		case status == 409 && strings.Contains(body, string(errcode.AlreadyProvisioned)):
			retriedHeld++
		default:
			t.Errorf("the retry of %s through router 1: %d %s", id, status, body)
		}
		outcome[i] = "made"
	}
	if t.Failed() {
		t.FailNow()
	}
	// Every object is made, once, by the controller that took over.
	for i := range viaObjects {
		waitObjectWithin(t, admin, 2*time.Minute, fmt.Sprintf("k-%03d made", i), client.ObjectKey{Namespace: config.Namespace, Name: fmt.Sprintf("k-%03d", i)}, &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
			if s.Status.Node == "" || s.Status.State != v1alpha1.StateRunning {
				return fmt.Errorf("status %+v", s.Status)
			}
			return nil
		})
	}

	// Lost none, doubled none: every id made is on exactly one node, with one object naming
	// that node, those whose answer was lost with router 0 and were retried included.
	where := map[string][]string{}
	perNode := map[string]int{}
	for _, n := range nodes {
		for _, sb := range listAll(t, n.d) {
			where[sb.ID] = append(where[sb.ID], n.name)
			perNode[n.name]++
			if sb.Resources.MemoryMB != memoryMB {
				t.Errorf("%s on %s has %d MiB", sb.ID, n.name, sb.Resources.MemoryMB)
			}
		}
	}
	var objs v1alpha1.SandboxList
	if err := admin.List(ctx, &objs, client.InNamespace(config.Namespace)); err != nil {
		t.Fatal(err)
	}
	objNode := map[string]string{}
	for _, o := range objs.Items {
		objNode[o.Name] = o.Status.Node
	}
	expect := func(id string, required bool) {
		on := where[id]
		switch {
		case len(on) > 1:
			t.Errorf("%s is on %v: doubled", id, on)
		case len(on) == 0 && required:
			t.Errorf("%s was made and is on no node: lost", id)
		case len(on) == 1:
			waitObject(t, admin, id+"'s object", client.ObjectKey{Namespace: config.Namespace, Name: id}, &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
				if s.Status.Node != on[0] {
					return fmt.Errorf("the object names %q, the sandbox is on %s", s.Status.Node, on[0])
				}
				return nil
			})
		}
	}
	for i, o := range outcome {
		expect(fmt.Sprintf("s-%03d", i), o == "made")
	}
	for i := range viaObjects {
		expect(fmt.Sprintf("k-%03d", i), true)
	}
	if len(where) != total {
		t.Errorf("%d ids on the nodes, want all %d (%d made through the routers at once, %d whose answer was lost and were retried, %d objects)", len(where), total, made, unknown, viaObjects)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The spread follows the placement rule: what one placer placing all of them in turn
	// would give, within what two routers' and a controller's concurrent reservations move it.
	sim := placement.New()
	var simNodes []placement.Node
	for _, n := range nodes {
		simNodes = append(simNodes, placement.Node{Name: n.name, Live: true, Status: v1alpha1.BothyNodeStatus{
			Address: "x", Health: v1alpha1.NodeHealthy,
			Capacity: v1alpha1.Capacity{MemoryMB: int64(n.memory), MilliCPU: 1 << 40, Sandboxes: int32(n.slots)},
			Free:     v1alpha1.Capacity{MemoryMB: int64(n.memory), MilliCPU: 1 << 40, Sandboxes: int32(n.slots)}}})
	}
	expected := map[string]int{}
	for range len(where) {
		r, err := sim.Place(simNodes, placement.Request{MemoryMB: memoryMB, MilliCPU: 1000})
		if err != nil {
			t.Fatal(err)
		}
		expected[r.Node()]++
	}
	for _, n := range nodes {
		var bn v1alpha1.BothyNode
		waitObject(t, admin, n.name+"'s allocation", client.ObjectKey{Name: n.name}, &bn, func(b *v1alpha1.BothyNode) error {
			if int(b.Status.Allocated.Sandboxes) != perNode[n.name] {
				return fmt.Errorf("allocated %+v, %d sandboxes listed", b.Status.Allocated, perNode[n.name])
			}
			return nil
		})
		a, c := bn.Status.Allocated, bn.Status.Capacity
		if perNode[n.name] > n.slots || a.MemoryMB > c.MemoryMB || a.Sandboxes > c.Sandboxes || a.MilliCPU > c.MilliCPU {
			t.Errorf("%s is over its limits: allocated %+v of %+v", n.name, a, c)
		}
		if diff := perNode[n.name] - expected[n.name]; diff > 10 || diff < -10 {
			t.Errorf("%s holds %d sandboxes; the placement rule gives it %d", n.name, perNode[n.name], expected[n.name])
		}
	}
	t.Logf("spread of %d sandboxes: %v; the placement rule alone: %v (capacities: a %d slots/%d MiB, b %d/%d, c %d/%d)",
		len(where), perNode, expected, nodes[0].slots, nodes[0].memory, nodes[1].slots, nodes[1].memory, nodes[2].slots, nodes[2].memory)
	replaced := 0
	for _, r := range routers {
		replaced += strings.Count(r.logs.String(), "placing it again")
	}
	t.Logf("creates a node refused for want of room (the routers' reservations are their own) and a router placed again: %d", replaced)
	t.Logf("creates per second: %.1f through two routers to three nodes (%d creates, %d workers, router 0 killed after %v), %.1f straight to one node (%d creates, same workers); %d answers lost with router 0, retried through router 1: %d made then, %d made before (already-provisioned)",
		clusterRate, made, workers, killedAt.Sub(start).Round(time.Millisecond), singleRate, single, unknown, retriedMade, retriedHeld)

	// A node SIGKILLed: its sandboxes read node-lost within its lease (6 s) and a look of
	// the surviving controller; after its restart they read running again.
	lost := nodes[2]
	var lostIDs []string
	for id, on := range where {
		if on[0] == lost.name {
			lostIDs = append(lostIDs, id)
		}
	}
	sort.Strings(lostIDs)
	killed := time.Now()
	lost.d.Kill()
	for _, id := range lostIDs {
		waitObjectWithin(t, admin, time.Minute, id+" node-lost", client.ObjectKey{Namespace: config.Namespace, Name: id}, &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
			if s.Status.State != v1alpha1.StateNodeLost {
				return fmt.Errorf("state %q", s.Status.State)
			}
			return nil
		})
	}
	t.Logf("the %d sandboxes of %s read node-lost %v after its SIGKILL (lease 6 s)", len(lostIDs), lost.name, time.Since(killed).Round(time.Millisecond))
	restarted := time.Now()
	lost.d.start()
	for _, id := range lostIDs {
		waitObjectWithin(t, admin, time.Minute, id+" running again", client.ObjectKey{Namespace: config.Namespace, Name: id}, &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
			if s.Status.State != v1alpha1.StateRunning || s.Status.Node != lost.name {
				return fmt.Errorf("status %+v", s.Status)
			}
			return nil
		})
	}
	t.Logf("and running again %v after its restart began", time.Since(restarted).Round(time.Millisecond))

	// The objects and the nodes' stores agree.
	rep, code := newClusterChecker(t, cp, nodeToken).run()
	if code != 0 || rep.LiveNodes != 3 || rep.Sandboxes != len(where) {
		t.Fatalf("the cluster-wide check: exit %d, %+v", code, rep)
	}
	t.Logf("the cluster-wide check: clean, %d sandboxes on %d nodes, %d objects; the suite took %v", rep.Sandboxes, rep.LiveNodes, rep.Objects, time.Since(began).Round(time.Second))
}

// listedSandbox is what the suite reads of a node's list.
type listedSandbox struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Resources struct {
		MemoryMB int `json:"memory_mb"`
	} `json:"resources"`
}

// listAll lists every sandbox of d, page by page.
func listAll(t *testing.T, d *daemon) []listedSandbox {
	t.Helper()
	var out []listedSandbox
	cursor := ""
	for {
		path := "/v1/sandboxes?limit=1000"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		r := d.doJSON("GET", path, nil)
		var page struct {
			Items      []listedSandbox `json:"items"`
			NextCursor string          `json:"next_cursor"`
		}
		if r.Status != 200 || json.Unmarshal(r.Body, &page) != nil {
			t.Fatalf("list: %d %s", r.Status, r.Body)
		}
		out = append(out, page.Items...)
		if cursor = page.NextCursor; cursor == "" {
			return out
		}
	}
}
