package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/secret"
	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/volume"
)

// clusterOptions are node mode's flags (docs/cluster.md): off unless --cluster-node.
type clusterOptions struct {
	enabled       bool
	kubeconfig    string
	nodeName      string
	namespace     string
	address       string
	maxSandboxes  int
	memoryMB      int
	cpuOvercommit float64
	leaseDuration time.Duration
}

// defaultCPUOvercommit is how many times its CPUs a node offers in sandboxes' CPU limits by
// default: a CPU limit caps a sandbox, it does not reserve a core, and most sandboxes idle;
// one host serves thousands of 1-vCPU sandboxes on a few cores. Memory is not overcommitted
// by default: a sandbox that reaches its memory limit holds that memory.
const defaultCPUOvercommit = 8

// defaultMaxSandboxes is a node's sandbox slots when the operator does not say: about the
// idle sandboxes one host has been measured to hold (docs/performance.md).
const defaultMaxSandboxes = 4000

func addClusterFlags(fs *flag.FlagSet) (*clusterOptions, error) {
	c := &clusterOptions{}
	maxSandboxes, err := envParsed("BOTHY_CLUSTER_MAX_SANDBOXES", defaultMaxSandboxes, strconv.Atoi)
	if err != nil {
		return nil, err
	}
	memoryMB, err := envParsed("BOTHY_CLUSTER_MEMORY_MB", 0, strconv.Atoi)
	if err != nil {
		return nil, err
	}
	cpuOvercommit, err := envParsed("BOTHY_CLUSTER_CPU_OVERCOMMIT", float64(defaultCPUOvercommit), func(v string) (float64, error) { return strconv.ParseFloat(v, 64) })
	if err != nil {
		return nil, err
	}
	lease, err := envParsed("BOTHY_CLUSTER_LEASE_DURATION", node.DefaultLeaseDuration, time.ParseDuration)
	if err != nil {
		return nil, err
	}
	hostname, _ := os.Hostname()
	fs.BoolVar(&c.enabled, "cluster-node", os.Getenv("BOTHY_CLUSTER_NODE") == "1", "run as a node of a bothy cluster on Kubernetes (docs/cluster.md): hold the node's lease, publish its capacity and mirror its sandboxes into Sandbox objects (env BOTHY_CLUSTER_NODE=1)")
	fs.StringVar(&c.kubeconfig, "cluster-kubeconfig", os.Getenv("KUBECONFIG"), "the kubeconfig file that reaches the API server (env KUBECONFIG); default: the pod's service account (in-cluster)")
	fs.StringVar(&c.nodeName, "cluster-node-name", envOr("NODE_NAME", hostname), "the node's name in the cluster, unique like a kubelet's (env NODE_NAME); default: the host name")
	fs.StringVar(&c.namespace, "cluster-namespace", envOr("BOTHY_CLUSTER_NAMESPACE", config.Namespace), "the namespace of the Sandbox objects and the node's lease (env BOTHY_CLUSTER_NAMESPACE)")
	fs.StringVar(&c.address, "cluster-address", os.Getenv("BOTHY_CLUSTER_ADDRESS"), "the URL at which routers reach this node's API (env BOTHY_CLUSTER_ADDRESS); default: http:// and the address served on")
	fs.IntVar(&c.maxSandboxes, "cluster-max-sandboxes", maxSandboxes, "the sandbox slots this node offers the cluster (env BOTHY_CLUSTER_MAX_SANDBOXES)")
	fs.IntVar(&c.memoryMB, "cluster-memory-mb", memoryMB, "the memory in MiB this node offers the cluster's sandboxes (env BOTHY_CLUSTER_MEMORY_MB); 0: the host's")
	fs.Float64Var(&c.cpuOvercommit, "cluster-cpu-overcommit", cpuOvercommit, "how many times the host's CPUs this node offers in sandboxes' CPU limits (env BOTHY_CLUSTER_CPU_OVERCOMMIT)")
	fs.DurationVar(&c.leaseDuration, "cluster-lease-duration", lease, "how long after its last renewal the node's lease lapses; renewals come at 2/15 of it (env BOTHY_CLUSTER_LEASE_DURATION)")
	return c, nil
}

// check validates the options once parsed.
func (c *clusterOptions) check() error {
	if !c.enabled {
		return nil
	}
	if c.nodeName == "" {
		return errors.New("--cluster-node needs a node name: give --cluster-node-name (or NODE_NAME)")
	}
	if c.maxSandboxes < 1 || c.maxSandboxes > 1_000_000 {
		return fmt.Errorf("--cluster-max-sandboxes %d: want 1 to 1000000", c.maxSandboxes)
	}
	if c.memoryMB < 0 {
		return fmt.Errorf("--cluster-memory-mb %d: want 0 (the host's) or more", c.memoryMB)
	}
	if c.cpuOvercommit < 1 || c.cpuOvercommit > 1000 {
		return fmt.Errorf("--cluster-cpu-overcommit %g: want 1 to 1000", c.cpuOvercommit)
	}
	if c.leaseDuration < 3*time.Second || c.leaseDuration > 10*time.Minute {
		return fmt.Errorf("--cluster-lease-duration %v: want 3s to 10m", c.leaseDuration)
	}
	return nil
}

// Client-side rate limits of the API server's clients. client-go's defaults (5 requests per
// second, bursts of 10) are for controllers that read from caches; a node writes each
// sandbox's object on each change and the router reads the objects on each call, so at the
// defaults the client's own throttling cost the router about 200 ms a call
// (BenchmarkClusterRouter). The API server's priority and fairness still protects it.
const (
	clientQPS   = 200
	clientBurst = 400
)

// restConfig is the API server's configuration: the kubeconfig file, or in-cluster.
func (c *clusterOptions) restConfig() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if c.kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
			return nil, fmt.Errorf("--cluster-kubeconfig %s: %w", c.kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("without --cluster-kubeconfig (or KUBECONFIG) bothyd must run in a pod with a service account: %w", err)
	}
	cfg.QPS, cfg.Burst = clientQPS, clientBurst
	return cfg, nil
}

// lateSandboxes reads the supervisor that serve makes after the node: the node must exist
// before the supervisor, whose events it follows from the first.
type lateSandboxes struct{ sup **supervisor.Supervisor }

func (l lateSandboxes) List() ([]*supervisor.Status, error)          { return (*l.sup).List() }
func (l lateSandboxes) Status(id string) (*supervisor.Status, error) { return (*l.sup).Status(id) }

// newClusterNode makes the node mode's Node for a server on addr whose supervisor will be
// *sup, or nil when node mode is off.
func newClusterNode(c *clusterOptions, addr net.Addr, sup **supervisor.Supervisor, vols *volume.Store, secrets *secret.Manager, actions *objectActions, health *supervisor.StorageHealth, log *slog.Logger) (*node.Node, error) {
	if !c.enabled {
		return nil, nil
	}
	// client-go's own lines (the leader election's) go to bothyd's log, not to stderr in
	// klog's format.
	klog.SetSlogLogger(log.With("component", "client-go"))
	// And controller-runtime's (the informer of the node's Sandbox objects).
	crlog.SetLogger(logr.FromSlogHandler(log.With("component", "controller-runtime").Handler()))
	cfg, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	address := c.address
	if address == "" {
		address = "http://" + addr.String()
	}
	memoryMB := int64(c.memoryMB)
	if memoryMB == 0 {
		if memoryMB, err = hostMemoryMB(); err != nil {
			return nil, err
		}
	}
	return node.New(node.Config{
		Rest: cfg, Name: c.nodeName, Namespace: c.namespace, Address: address, Version: version,
		Sandboxes:  lateSandboxes{sup},
		Create:     actions.create,
		Delete:     actions.delete,
		CrashPoint: crashPoint(),
		Capacity: v1alpha1.Capacity{
			MemoryMB:  memoryMB,
			MilliCPU:  int64(float64(goruntime.NumCPU()) * 1000 * c.cpuOvercommit),
			Sandboxes: int32(c.maxSandboxes), //nolint:gosec // bounded by check
		},
		Health:        func() (v1alpha1.NodeHealth, string) { return nodeHealth(health.Status()) },
		Images:        func() []string { return readyImages(*sup) },
		Generations:   func() []v1alpha1.Generation { return heldGenerations(*sup) },
		Volumes:       func() []string { return volumeNames(vols) },
		Secrets:       func() []string { return secretNames(secrets) },
		LeaseDuration: c.leaseDuration,
		RenewDeadline: c.leaseDuration * 2 / 3,
		RetryPeriod:   c.leaseDuration * 2 / 15,
		Logger:        log,
	})
}

// runClusterNode runs n until ctx ends or the returned stop is called; stop waits for its end
// (the lease's release), bounded so that a server whose API server is gone still stops.
func runClusterNode(ctx context.Context, n *node.Node, log *slog.Logger) (stop func()) {
	if n == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.Run(ctx); err != nil {
			log.Error("cluster node stopped", "err", err)
		}
	}()
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			log.Warn("cluster node: did not release its lease within 10 s of shutting down; it lapses on its own")
		}
	}
}

// nodeHealth is the node's verdict from its state root's health.
func nodeHealth(st supervisor.StorageStatus) (v1alpha1.NodeHealth, string) {
	switch st.State {
	case supervisor.StorageOK:
		return v1alpha1.NodeHealthy, ""
	case supervisor.StorageFull:
		return v1alpha1.NodeDegraded, "The state root's file system is full; free space on it."
	default:
		return v1alpha1.NodeUnhealthy, "The state root's file system is unavailable (read-only or failing); the operator must repair it."
	}
}

// readyImages are the names of the images the node holds ready.
func readyImages(sup *supervisor.Supervisor) []string {
	if sup == nil {
		return nil
	}
	images, err := sup.ListImages()
	if err != nil {
		return nil
	}
	var names []string
	for _, im := range images {
		if im.State == supervisor.ImageReady {
			names = append(names, im.Name)
		}
	}
	return names
}

// volumeNames are the names of the volumes vols holds, for the BothyNode's status: all of
// them (a node holds at most volume.MaxVolumes, the status's bound).
func volumeNames(vols *volume.Store) []string {
	if vols == nil {
		return nil
	}
	list, err := vols.List()
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(list))
	for _, v := range list {
		names = append(names, v.Name)
	}
	return names
}

// hostMemoryMB is MemTotal of /proc/meminfo in MiB.
func hostMemoryMB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("the host's memory, for the node's capacity (or give --cluster-memory-mb): %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, err
			}
			return kib / 1024, nil
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo; give --cluster-memory-mb")
}

// secretNames are the names of the node's secrets, for its BothyNode's status; never a value.
func secretNames(secrets *secret.Manager) []string {
	if secrets == nil {
		return nil
	}
	list := secrets.List()
	names := make([]string, 0, len(list))
	for _, s := range list {
		names = append(names, s.Name)
	}
	return names
}

// clusterSecrets are the node's secrets as its APIs (bothy's and E2B's) change them: a create
// or a delete asks for the node's status to be rewritten at once, so that a router places a
// sandbox binding a new secret here within a second (docs/cluster.md, "Secrets"). Node is nil
// outside node mode, and then nothing is asked.
type clusterSecrets struct {
	*secret.Manager
	node *node.Node
}

func (s clusterSecrets) Create(name, value string) (*secret.Secret, error) {
	out, err := s.Manager.Create(name, value)
	if err == nil {
		s.node.SecretsChanged()
	}
	return out, err
}

func (s clusterSecrets) Delete(name string) error {
	err := s.Manager.Delete(name)
	if err == nil {
		s.node.SecretsChanged()
	}
	return err
}
