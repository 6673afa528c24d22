package helm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/internal/kubetest"
)

// envHelmBin names a directory holding helm, instead of the cache scripts/helm/build fills.
const envHelmBin = "BOTHY_HELM_BIN"

// helmBinary finds the helm scripts/helm/build built, or skips t saying how to build it
// (fails it when BOTHY_KUBE_REQUIRED is set, as .ci/run does, so CI cannot pass by skipping).
func helmBinary(t *testing.T) string {
	t.Helper()
	dir, err := helmDir()
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "helm"))
	}
	if err != nil {
		msg := fmt.Sprintf("helm is not built (%v): run scripts/helm/build (a few minutes the first time), or set %s to a directory holding helm", err, envHelmBin)
		if os.Getenv(kubetest.EnvRequired) != "" {
			t.Fatalf("%s is set and %s", kubetest.EnvRequired, msg)
		}
		t.Skip("skipping: " + msg)
	}
	return filepath.Join(dir, "helm")
}

// helmDir is where scripts/helm/build caches helm: the first 16 hex digits of the SHA-256 of
// scripts/helm/tool's go.mod and go.sum and a line naming the Go version, OS and
// architecture. It must stay byte for byte what the script hashes.
func helmDir() (string, error) {
	if dir := os.Getenv(envHelmBin); dir != "" {
		return dir, nil
	}
	module := filepath.Join("..", "..", "scripts", "helm", "tool")
	h := sha256.New()
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(module, name))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	fmt.Fprintf(h, "%s %s %s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "bothy", "helm", hex.EncodeToString(h.Sum(nil))[:16]), nil
}

// render runs `helm template` on the chart in namespace with args (values), CRDs included,
// and returns its objects, or helm's error output.
func render(t *testing.T, helm, namespace string, args ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	out, err := runHelm(t, helm, append([]string{"template", "bothy", "bothy", "--namespace", namespace, "--include-crds"}, args...)...)
	if err != nil {
		return nil, err
	}
	return decode(t, out), nil
}

// runHelm runs helm with args and returns its output, or an error holding its error output.
func runHelm(t *testing.T, helm string, args ...string) ([]byte, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helm, args...)
	// helm keeps its cache, config and data under these; a test touches none of the user's.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %v: %s", args[0], err, stderr.String())
	}
	return stdout.Bytes(), nil
}

func decode(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding helm's output: %v", err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// tokenFile writes a random token to a file for --set-file, as a user would give it.
func tokenFile(t *testing.T) (path, token string) {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	token = base64.StdEncoding.EncodeToString(b)
	path = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, token
}

func key(obj *unstructured.Unstructured) string {
	return obj.GetKind() + " " + obj.GetNamespace() + "/" + obj.GetName()
}

// TestChartRefusesBadValues renders the chart with each wrong way of giving the tokens (it
// has no default token and must say which value to give) and with values bothyd would refuse
// at start, which values.schema.json refuses at install.
func TestChartRefusesBadValues(t *testing.T) {
	t.Parallel()
	helm := helmBinary(t)
	file, _ := tokenFile(t)
	tokens := []string{"--set", "tokens.router.existingSecret=r", "--set", "tokens.node.existingSecret=n"}
	tests := []struct {
		name string
		args []string
		want string // in helm's error; empty: renders
	}{
		{"none", nil, "tokens.router is required"},
		{"router alone", []string{"--set-file", "tokens.router.value=" + file}, "tokens.node is required"},
		{"node alone", []string{"--set", "tokens.node.existingSecret=n"}, "tokens.router is required"},
		{"short", []string{"--set", "tokens.router.value=  short-token  ", "--set", "tokens.node.existingSecret=n"}, "tokens.router.value is shorter than 16 characters"},
		{"both ways", []string{"--set-file", "tokens.node.value=" + file, "--set", "tokens.node.existingSecret=n", "--set", "tokens.router.existingSecret=r"}, "give either tokens.node.value or tokens.node.existingSecret, not both"},
		{"values", []string{"--set-file", "tokens.router.value=" + file, "--set-file", "tokens.node.value=" + file}, ""},
		{"existing Secrets", tokens, ""},
		{"a short operator token", append([]string{"--set", "tokens.operator.value=short"}, tokens...), "tokens.operator.value is shorter than 16 characters"},
		{"an operator token both ways", append([]string{"--set-file", "tokens.operator.value=" + file, "--set", "tokens.operator.existingSecret=o"}, tokens...), "give either tokens.operator.value or tokens.operator.existingSecret, not both"},
		{"no sandbox slots", append([]string{"--set", "node.maxSandboxes=0"}, tokens...), "at '/node/maxSandboxes': minimum: got 0, want 1"},
		{"a misspelt value", append([]string{"--set", "node.maxSandbox=10"}, tokens...), "additional properties 'maxSandbox' not allowed"},
		{"a lease without a unit", append([]string{"--set", "node.leaseDuration=15"}, tokens...), "at '/node/leaseDuration'"},
		{"a fraction through --set", append([]string{"--set", "node.cpuOvercommit=1.5"}, tokens...), ""},
		{"no overcommit", append([]string{"--set", "node.cpuOvercommit=0"}, tokens...), "at '/node/cpuOvercommit'"},
		{"extra env", append([]string{"--set-json", `node.extraEnv=[{"name":"BOTHY_LOG_LEVEL","value":"debug"}]`}, tokens...), ""},
		{"extra env moving the state root", append([]string{"--set-json", `node.extraEnv=[{"name":"BOTHY_ROOT","value":"/tmp"}]`}, tokens...), "at '/node/extraEnv/0/name'"},
		{"registries", append([]string{"--set", "node.registries.authSecret=creds", "--set", "node.registries.mirror=mirror.example.com:5000", "--set", "node.registries.insecure={10.0.0.1:5000}", "--set", "node.registries.templateRepository=10.0.0.1:5000/bothy/templates"}, tokens...), ""},
		{"a mirror given as a URL", append([]string{"--set", "node.registries.mirror=https://mirror.example.com"}, tokens...), "at '/node/registries/mirror'"},
		{"a template registry without a path", append([]string{"--set", "node.registries.templateRepository=registry.example.com"}, tokens...), "at '/node/registries/templateRepository'"},
		{"extra env giving the registries' credentials", append([]string{"--set-json", `node.extraEnv=[{"name":"BOTHY_REGISTRY_AUTH","value":"/tmp/x"}]`}, tokens...), "at '/node/extraEnv/0/name'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			objs, err := render(t, helm, config.Namespace, tt.args...)
			if tt.want == "" {
				if err != nil || len(objs) == 0 {
					t.Fatalf("rendered %d objects, %v; want the chart", len(objs), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want an error saying %q", err, tt.want)
			}
		})
	}
}

// TestChartOperatorToken: the optional operator's token reaches the router (its Secret, the
// flag and the mount) when it is given, and nothing of it is rendered when it is not.
func TestChartOperatorToken(t *testing.T) {
	t.Parallel()
	helm := helmBinary(t)
	file, _ := tokenFile(t)
	tokens := []string{"--set-file", "tokens.router.value=" + file, "--set-file", "tokens.node.value=" + file}
	routerArgs := func(objs []*unstructured.Unstructured) (args []string, secrets []string) {
		for _, o := range objs {
			if o.GetKind() == "Secret" {
				secrets = append(secrets, o.GetName())
			}
			if o.GetKind() != "Deployment" || o.GetName() != "bothy-router" {
				continue
			}
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				a, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
				args = append(args, a...)
			}
		}
		return args, secrets
	}
	objs, err := render(t, helm, config.Namespace, tokens...)
	if err != nil {
		t.Fatal(err)
	}
	if args, secrets := routerArgs(objs); len(args) == 0 || slices.Contains(args, "--operator-token-file") || slices.Contains(secrets, "bothy-operator-token") {
		t.Fatalf("without an operator's token: router args %v, Secrets %v", args, secrets)
	}
	objs, err = render(t, helm, config.Namespace, append([]string{"--set-file", "tokens.operator.value=" + file}, tokens...)...)
	if err != nil {
		t.Fatal(err)
	}
	if args, secrets := routerArgs(objs); !slices.Contains(args, "--operator-token-file") || !slices.Contains(secrets, "bothy-operator-token") {
		t.Fatalf("with an operator's token: router args %v, Secrets %v", args, secrets)
	}
}

// TestChartMatchesClusterConfig renders the chart into bothy-system and holds its CRDs,
// service accounts, roles and bindings to cluster/config's, which the cluster tests install
// (config.Install): the chart grants exactly what those tests exercise, both ways.
func TestChartMatchesClusterConfig(t *testing.T) {
	t.Parallel()
	helm := helmBinary(t)
	file, _ := tokenFile(t)
	rendered, err := render(t, helm, config.Namespace, "--set-file", "tokens.router.value="+file, "--set-file", "tokens.node.value="+file)
	if err != nil {
		t.Fatal(err)
	}
	compared := map[string][]string{ // the fields that make each kind what it is
		"CustomResourceDefinition": {"spec"},
		"ServiceAccount":           nil,
		"ClusterRole":              {"rules"},
		"Role":                     {"rules"},
		"ClusterRoleBinding":       {"roleRef", "subjects"},
		"RoleBinding":              {"roleRef", "subjects"},
	}
	chart := map[string]*unstructured.Unstructured{}
	for _, obj := range rendered {
		if _, ok := compared[obj.GetKind()]; ok {
			chart[key(obj)] = obj
		}
	}
	installed, err := config.Objects()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, want := range installed {
		fields, ok := compared[want.GetKind()]
		if !ok {
			continue // the Namespace: helm install --create-namespace makes it
		}
		k := key(want)
		seen[k] = true
		got, ok := chart[k]
		if !ok {
			t.Errorf("the chart has no %s, which cluster/config installs", k)
			continue
		}
		for _, f := range fields {
			if !reflect.DeepEqual(got.Object[f], want.Object[f]) {
				t.Errorf("%s: the chart's %s\n%v\ndiffers from cluster/config's\n%v", k, f, got.Object[f], want.Object[f])
			}
		}
	}
	for k := range chart {
		if !seen[k] {
			t.Errorf("the chart makes %s, which cluster/config does not install", k)
		}
	}
	if len(seen) < 17 {
		t.Fatalf("compared %d objects; want the 2 CRDs, 3 service accounts, 6 roles and 6 bindings", len(seen))
	}
}

// installOrder is the order in which the test creates what the chart renders, as helm
// install does: what others name first.
var installOrder = []string{"Namespace", "ServiceAccount", "Secret", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "DaemonSet", "Deployment"}

// TestChartInstallsIntoAPIServer renders the chart with the example values (the router's
// token given as a value, the node's as an existing Secret with a key of its own) into a
// namespace other than bothy-system, creates every object in a real kube-apiserver, whose
// validation checks each, and checks that the release's namespace is used throughout: the
// objects land in it, and its service accounts hold their rights there and nowhere else.
func TestChartInstallsIntoAPIServer(t *testing.T) {
	helm := helmBinary(t)
	const ns = "sandboxes"
	nodeUser := "system:serviceaccount:" + ns + ":bothy-node"
	routerUser := "system:serviceaccount:" + ns + ":bothy-router"
	cp := kubetest.Start(t, kubetest.Options{Users: []string{nodeUser, routerUser}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := newClient(t, cp.Config)

	file, token := tokenFile(t)
	objs, err := render(t, helm, ns, "--values", "example-values.yaml",
		"--set", "tokens.router.existingSecret=", "--set-file", "tokens.router.value="+file,
		"--set", "tokens.node.existingSecret=site-tokens", "--set", "tokens.node.existingSecretKey=node")
	if err != nil {
		t.Fatal(err)
	}

	// CRDs first, and served before anything names them.
	var rest []*unstructured.Unstructured
	for _, obj := range objs {
		if obj.GetKind() != "CustomResourceDefinition" {
			rest = append(rest, obj)
			continue
		}
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s: %v", key(obj), err)
		}
	}
	rank := map[string]int{}
	for i, kind := range installOrder {
		rank[kind] = i + 1
	}
	sort.SliceStable(rest, func(i, j int) bool { return rank[rest[i].GetKind()] < rank[rest[j].GetKind()] })
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// The node's token is the operator's Secret, made beforehand.
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "site-tokens", Namespace: ns}, StringData: map[string]string{"node": token}}); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, obj := range rest {
		if rank[obj.GetKind()] == 0 {
			t.Fatalf("the chart renders %s, which the test does not know where to create", key(obj))
		}
		if scoped := obj.GetKind() != "ClusterRole" && obj.GetKind() != "ClusterRoleBinding"; scoped && obj.GetNamespace() != ns {
			t.Errorf("%s is not in the release's namespace %s", key(obj), ns)
		}
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s: %v", key(obj), err)
		}
		kinds[obj.GetKind()]++
	}
	want := map[string]int{"ServiceAccount": 3, "Secret": 1, "ClusterRole": 3, "ClusterRoleBinding": 3, "Role": 3, "RoleBinding": 3, "Service": 1, "DaemonSet": 1, "Deployment": 2}
	if !reflect.DeepEqual(kinds, want) {
		t.Fatalf("created %v; want %v", kinds, want)
	}

	// The Secret the chart made holds the token as given, less the file's newline.
	var secret corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bothy-router-token"}, &secret); err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["token"]) != token {
		t.Fatalf("the router's Secret holds %d bytes, not the token given", len(secret.Data["token"]))
	}
	// The node reads its token from the operator's Secret and key, and its settings from
	// the values.
	var ds unstructured.Unstructured
	ds.SetAPIVersion("apps/v1")
	ds.SetKind("DaemonSet")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bothy-node"}, &ds); err != nil {
		t.Fatal(err)
	}
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	var tokenVolume string
	for _, v := range vols {
		if m, _ := v.(map[string]any); m["name"] == "token" {
			tokenVolume = fmt.Sprint(m["secret"])
		}
	}
	if !strings.Contains(tokenVolume, "secretName:site-tokens") || !strings.Contains(tokenVolume, "key:node") {
		t.Fatalf("the node's token volume is %s; want the Secret site-tokens, key node", tokenVolume)
	}
	// The registries' credentials are the operator's Secret, mounted where
	// BOTHY_REGISTRY_AUTH points (example-values.yaml's node.registries).
	var authVolume string
	for _, v := range vols {
		if m, _ := v.(map[string]any); m["name"] == "registry-auth" {
			authVolume = fmt.Sprint(m["secret"])
		}
	}
	if !strings.Contains(authVolume, "secretName:bothy-registry-auth") || !strings.Contains(authVolume, "key:.dockerconfigjson path:config.json") {
		t.Fatalf("the node's registry credentials volume is %q; want the Secret bothy-registry-auth, key .dockerconfigjson as config.json", authVolume)
	}
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
	if !slices.ContainsFunc(mounts, func(m any) bool {
		mm, _ := m.(map[string]any)
		return mm["name"] == "registry-auth" && mm["mountPath"] == "/run/secrets/bothy-registry" && mm["readOnly"] == true
	}) {
		t.Fatalf("the node's mounts %v have no read-only registry-auth at /run/secrets/bothy-registry", mounts)
	}
	env := containerEnv(t, &ds)
	for name, value := range map[string]string{"BOTHY_CLUSTER_NAMESPACE": ns, "BOTHY_CLUSTER_MEMORY_MB": "57344", "BOTHY_CLUSTER_MAX_SANDBOXES": "2000", "BOTHY_CLUSTER_CPU_OVERCOMMIT": "4", "BOTHY_CLUSTER_LEASE_DURATION": "15s",
		"BOTHY_REGISTRY_AUTH": "/run/secrets/bothy-registry/config.json", "BOTHY_REGISTRY_MIRROR": "mirror.example.com", "BOTHY_TEMPLATE_REGISTRY": "registry.example.com/bothy/templates"} {
		if env[name] != value {
			t.Errorf("the node's %s is %q; want %q", name, env[name], value)
		}
	}

	// Each service account holds its generated rights in the release's namespace alone.
	waitServed(ctx, t, c, ns)
	node := newClient(t, cp.ConfigFor(nodeUser))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "bothy-node-a", Namespace: ns}}
	if err := node.Create(ctx, lease); err != nil {
		t.Fatalf("the node's service account making its Lease in %s: %v", ns, err)
	}
	var sandboxes v1alpha1.SandboxList
	if err := node.List(ctx, &sandboxes, client.InNamespace(ns)); err != nil {
		t.Fatalf("the node's service account listing Sandboxes in %s: %v", ns, err)
	}
	if err := node.List(ctx, &sandboxes, client.InNamespace(config.Namespace)); !apierrors.IsForbidden(err) {
		t.Fatalf("the node's service account listing Sandboxes in %s: got %v, want Forbidden", config.Namespace, err)
	}
	router := newClient(t, cp.ConfigFor(routerUser))
	var nodes v1alpha1.BothyNodeList
	if err := router.List(ctx, &nodes); err != nil {
		t.Fatalf("the router's service account listing BothyNodes: %v", err)
	}
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "bothy-node-b", Namespace: ns}}
	if err := router.Create(ctx, other); !apierrors.IsForbidden(err) {
		t.Fatalf("the router's service account making a Lease: got %v, want Forbidden (it writes nothing)", err)
	}
}

// TestChartHelmInstallUpgradeUninstall runs what docs/cluster.md tells a user to run —
// helm install with the tokens, helm upgrade, helm uninstall — with the real helm against
// the real kube-apiserver, and checks what the docs say of each: the install makes the CRDs
// and the parts, the upgrade changes what it is given and keeps the rest, and the uninstall
// removes the parts and the Secret the chart made but keeps the CRDs, the Sandbox objects
// and the Secret the operator made.
func TestChartHelmInstallUpgradeUninstall(t *testing.T) {
	helm := helmBinary(t)
	const ns = "bothy-system"
	cp := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newClient(t, cp.Config)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, kubetest.Admin); err != nil {
		t.Fatal(err)
	}
	file, token := tokenFile(t)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bothy-node-token", Namespace: ns}, StringData: map[string]string{"token": token}}); err != nil {
		t.Fatal(err)
	}
	helmAt := func(args ...string) {
		t.Helper()
		if _, err := runHelm(t, helm, append(args, "--kubeconfig", kubeconfig, "--namespace", ns)...); err != nil {
			t.Fatal(err)
		}
	}
	helmAt("install", "bothy", "bothy", "--values", "example-values.yaml",
		"--set", "tokens.router.existingSecret=", "--set-file", "tokens.router.value="+file)
	waitServed(ctx, t, c, ns)
	for _, name := range []string{"bothy-router", "bothy-controller"} {
		if replicas := deploymentReplicas(ctx, t, c, ns, name); replicas != map[string]int64{"bothy-router": 3, "bothy-controller": 2}[name] {
			t.Fatalf("after the install, %s has %d replicas", name, replicas)
		}
	}
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "sb-kept", Namespace: ns},
		Spec:       v1alpha1.SandboxSpec{Image: "host", Resources: v1alpha1.Resources{VCPUs: 1, MemoryMB: 512, Pids: 512}},
	}
	if err := c.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}

	helmAt("upgrade", "bothy", "bothy", "--reuse-values", "--set", "router.replicas=1")
	if replicas := deploymentReplicas(ctx, t, c, ns, "bothy-router"); replicas != 1 {
		t.Fatalf("after the upgrade to one router, bothy-router has %d replicas", replicas)
	}
	var secret corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bothy-router-token"}, &secret); err != nil || string(secret.Data["token"]) != token {
		t.Fatalf("after the upgrade with --reuse-values, the router's Secret: %v (holds the token given: %v)", err, string(secret.Data["token"]) == token)
	}

	helmAt("uninstall", "bothy", "--wait")
	gone := map[string]client.Object{
		"the nodes' DaemonSet":      &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"name": "bothy-node", "namespace": ns}}},
		"the Secret the chart made": &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bothy-router-token", Namespace: ns}},
		"the node's account":        &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bothy-node", Namespace: ns}},
	}
	for what, obj := range gone {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
			t.Errorf("after the uninstall, %s: got %v, want it gone", what, err)
		}
	}
	kept := map[string]client.Object{
		"the Secret the operator made": &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bothy-node-token", Namespace: ns}},
		"the Sandbox object":           &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "sb-kept", Namespace: ns}},
		"the Sandbox CRD":              &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": map[string]any{"name": "sandboxes.cluster.bothy.dev"}}},
	}
	for what, obj := range kept {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Errorf("after the uninstall, %s: %v; want it kept", what, err)
		}
	}
}

// deploymentReplicas is the named Deployment's spec.replicas.
func deploymentReplicas(ctx context.Context, t *testing.T, c client.Client, ns, name string) int64 {
	t.Helper()
	var d unstructured.Unstructured
	d.SetAPIVersion("apps/v1")
	d.SetKind("Deployment")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &d); err != nil {
		t.Fatalf("reading the Deployment %s: %v", name, err)
	}
	replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas")
	return replicas
}

// waitServed waits until the API server serves the CRDs, which it does a moment after their
// creation (their Established condition).
func waitServed(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var sandboxes v1alpha1.SandboxList
		var nodes v1alpha1.BothyNodeList
		err := c.List(ctx, &sandboxes, client.InNamespace(ns))
		if err == nil {
			err = c.List(ctx, &nodes)
		}
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the API server does not serve the chart's CRDs: %v", err)
		case <-tick.C:
		}
	}
}

// containerEnv is the literal environment of obj's pod template's first container.
func containerEnv(t *testing.T, obj *unstructured.Unstructured) map[string]string {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if len(containers) == 0 {
		t.Fatalf("%s has no container", key(obj))
	}
	env := map[string]string{}
	list, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "env")
	for _, e := range list {
		m, _ := e.(map[string]any)
		if v, ok := m["value"].(string); ok {
			env[fmt.Sprint(m["name"])] = v
		}
	}
	return env
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
