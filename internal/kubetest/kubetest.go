// Package kubetest starts a real Kubernetes control plane for tests: etcd and kube-apiserver,
// built from the Go module proxy by scripts/kube/build, on loopback with a temporary
// directory of their own (self-signed serving certificates, static tokens for the admin and
// for the users a test names, a service-account signing key). It waits until the API server
// answers /readyz and hands back a rest.Config; the test's cleanup stops both.
//
// A test that needs the control plane skips, saying how to build it, when the binaries are
// absent and BOTHY_KUBE_REQUIRED is unset; with BOTHY_KUBE_REQUIRED set (as .ci/run does) it
// fails instead, so that CI cannot pass by skipping. It is for tests only.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Environment variables that steer the harness.
const (
	// EnvBin names the directory holding kube-apiserver and etcd, instead of the cache
	// directory scripts/kube/build fills.
	EnvBin = "BOTHY_KUBE_BIN"
	// EnvRequired, when set to anything, makes absent binaries a failure rather than a skip.
	EnvRequired = "BOTHY_KUBE_REQUIRED"
)

// Admin is the user of ControlPlane.Config: a member of system:masters.
const Admin = "bothy-test-admin"

// readyTimeout bounds the wait for /readyz; the API server answers in seconds here, but a
// machine busy with other builds may be much slower.
const readyTimeout = 2 * time.Minute

// Options are what a test asks of its control plane.
type Options struct {
	// Users are extra users, each given a token of its own and no group beyond
	// system:authenticated, so that a test can exercise RBAC as them ("system:serviceaccount:
	// <namespace>:<name>" is how a service account's user is named).
	Users []string
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// Config is the admin's: a member of system:masters.
	Config *rest.Config
	// Dir is the control plane's temporary directory: certificates, etcd's data, the logs.
	Dir string
	// URL is the API server's address.
	URL string
	// Ready is how long the API server took from its start to its first 200 from /readyz.
	Ready time.Duration

	ca     []byte // PEM
	tokens map[string]string
}

// Binaries returns the directory that holds kube-apiserver and etcd, or why there is none.
func Binaries() (string, error) {
	if dir := os.Getenv(EnvBin); dir != "" {
		return dir, present(dir)
	}
	module, err := controlPlaneModule()
	if err != nil {
		return "", err
	}
	key, err := cacheKey(module)
	if err != nil {
		return "", err
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache")
	}
	dir := filepath.Join(cache, "bothy", "kube", key)
	return dir, present(dir)
}

func present(dir string) error {
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("%s is not built in %s: run scripts/kube/build (about five minutes the first time), or set %s to a directory holding kube-apiserver and etcd", name, dir, EnvBin)
		}
	}
	return nil
}

// controlPlaneModule finds scripts/kube/controlplane by walking up from the working
// directory, which go test sets to the package's.
func controlPlaneModule() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		m := filepath.Join(dir, "scripts", "kube", "controlplane")
		if _, err := os.Stat(filepath.Join(m, "go.mod")); err == nil {
			return m, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no scripts/kube/controlplane/go.mod above the working directory: run the test from inside the bothy tree, or set " + EnvBin)
		}
		dir = parent
	}
}

// cacheKey is the key scripts/kube/build files its build under: the first 16 hex digits of
// the SHA-256 of the module's go.mod and go.sum and a line naming the Go version, OS and
// architecture. It must stay byte for byte what the script hashes.
func cacheKey(module string) (string, error) {
	h := sha256.New()
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(module, name))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	fmt.Fprintf(h, "%s %s %s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Start starts a control plane for t, or skips t (fails it, with BOTHY_KUBE_REQUIRED set)
// when the binaries are not built. The control plane stops when t ends.
func Start(t testing.TB, o Options) *ControlPlane {
	t.Helper()
	bin, err := Binaries()
	if err != nil {
		if os.Getenv(EnvRequired) != "" {
			t.Fatalf("%s is set and the control plane is missing: %v", EnvRequired, err)
		}
		t.Skipf("skipping: %v", err)
	}
	dir := t.TempDir()
	cp := &ControlPlane{Dir: dir, tokens: map[string]string{}}
	if err := cp.writeCredentials(append([]string{Admin}, o.Users...)); err != nil {
		t.Fatal(err)
	}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	etcd := startProcess(t, filepath.Join(bin, "etcd"), filepath.Join(dir, "etcd.log"),
		"--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=test="+peerURL,
		// A test's data is thrown away: fsyncs would only slow it down.
		"--unsafe-no-fsync", "--log-level=warn")
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	started := time.Now()
	apiserver := startProcess(t, filepath.Join(bin, "kube-apiserver"), filepath.Join(dir, "kube-apiserver.log"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[2]),
		"--tls-cert-file="+filepath.Join(dir, "serving.crt"), "--tls-private-key-file="+filepath.Join(dir, "serving.key"),
		"--client-ca-file="+filepath.Join(dir, "ca.crt"),
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		// As kubeadm's clusters: bothy's node DaemonSet is privileged (deploy/helm).
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24",
		"--cert-dir="+filepath.Join(dir, "certs"))
	// Stop the API server before etcd (cleanups run last first).
	t.Cleanup(func() { stop(t, etcd) })
	t.Cleanup(func() { stop(t, apiserver) })
	// Registered last, run first: a failed test shows what the control plane said last
	// (a test once found the API server refusing connections, with nothing to say why).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- kube-apiserver log (tail) ---\n%s\n--- etcd log (tail) ---\n%s",
				tail(filepath.Join(dir, "kube-apiserver.log")), tail(filepath.Join(dir, "etcd.log")))
		}
	})

	cp.Config = cp.ConfigFor(Admin)
	if err := cp.waitReady(apiserver, etcd); err != nil {
		t.Fatalf("%v\n--- kube-apiserver log (tail) ---\n%s\n--- etcd log (tail) ---\n%s", err,
			tail(filepath.Join(dir, "kube-apiserver.log")), tail(filepath.Join(dir, "etcd.log")))
	}
	cp.Ready = time.Since(started)
	t.Logf("kube-apiserver at %s answered /readyz after %v", cp.URL, cp.Ready.Round(time.Millisecond))
	return cp
}

// ConfigFor is a rest.Config that authenticates as user, one of Options.Users or Admin.
func (cp *ControlPlane) ConfigFor(user string) *rest.Config {
	token, ok := cp.tokens[user]
	if !ok {
		panic("kubetest: no token for user " + user + "; name it in Options.Users")
	}
	return &rest.Config{
		Host:            cp.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.ca},
		QPS:             200,
		Burst:           400,
	}
}

// WriteKubeconfig writes a kubeconfig file for user to path, for a process the test starts.
func (cp *ControlPlane) WriteKubeconfig(path, user string) error {
	cfg := cp.ConfigFor(user)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

// waitReady polls /readyz until it answers 200, either process exits, or readyTimeout passes.
func (cp *ControlPlane) waitReady(procs ...*process) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.ca)
	c := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		for _, p := range procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited before the API server was ready: %v", filepath.Base(p.cmd.Path), p.err)
			default:
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cp.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.Config.BearerToken)
		resp, err := c.Do(req)
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body.String())
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver did not answer /readyz within %v; last: %s", readyTimeout, last)
		case <-tick.C:
		}
	}
}

// process is a started binary and its end.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProcess(t testing.TB, path, logPath string, args ...string) *process {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...) //nolint:noctx // stopped by the cleanup, with a signal first
	cmd.Stdout, cmd.Stderr = logf, logf
	// A test binary killed outright takes its control plane with it (on Linux).
	cmd.SysProcAttr = diesWithParent()
	p := &process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal fires when the thread that forked the child ends, not the
		// test binary: tests that enter network namespaces end threads (a goroutine that
		// exits locked to one), and one of them could be this one, which killed the API
		// server in the middle of a suite. The forking thread stays locked to this goroutine,
		// and so alive, until the child has been waited for.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		t.Fatalf("starting %s: %v", path, err)
	}
	return p
}

// stop ends p: SIGTERM, and SIGKILL if it has not exited after ten seconds.
func stop(t testing.TB, p *process) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Logf("%s did not stop on SIGTERM within 10 s; killing it", filepath.Base(p.cmd.Path))
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// freePorts finds n free loopback ports. The ports are released before the processes take
// them, so another process could take one in between; the test then fails with the
// process's own error in its log rather than hanging.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0") //nolint:noctx // a test's port probe
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeCredentials writes the CA, the serving certificate for 127.0.0.1 and localhost, the
// service-account signing key and the static token file naming users (the first is the
// admin, in system:masters).
func (cp *ControlPlane) writeCredentials(users []string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bothy kubetest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	cp.ca = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}, caCert, &servingKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	var tokens strings.Builder
	for i, user := range users {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		token := hex.EncodeToString(b)
		cp.tokens[user] = token
		groups := ""
		if i == 0 {
			groups = `,"system:masters"`
		}
		fmt.Fprintf(&tokens, "%s,%s,%s%s\n", token, user, user, groups)
	}
	files := map[string][]byte{
		"ca.crt":      cp.ca,
		"serving.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: servingDER}),
		"tokens.csv":  []byte(tokens.String()),
	}
	for name, key := range map[string]*ecdsa.PrivateKey{"serving.key": servingKey, "sa.key": saKey} {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		files[name] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(cp.Dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
