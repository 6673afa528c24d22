package main

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/bothy/bothy/check"
	"github.com/bothy/bothy/egress"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/secret"
	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/webhook"
)

// egressService joins the secrets (package secret), the egress proxy (package egress) and the
// network Manager, which opens each sandbox's listener (network.Egress), and tells the
// supervisor what a sandbox's environment and trust store need (supervisor.Secrets).
type egressService struct {
	secrets *secret.Manager
	ca      *egress.CA
	proxy   *egress.Proxy
	log     *slog.Logger

	mu     sync.Mutex
	served map[string]*egress.Sandbox
}

var (
	_ network.Egress     = (*egressService)(nil)
	_ supervisor.Secrets = (*egressService)(nil)
)

// openOutbound opens what sends on the host's behalf: the webhooks and the egress proxy.
func openOutbound(o *options, uses func(string) []secret.Use, log *slog.Logger) (*webhook.Manager, *egressService, error) {
	hooks, err := openWebhooks(o, log)
	if err != nil {
		return nil, nil, err
	}
	e, err := openEgress(o, uses, log)
	if err != nil {
		hooks.Close()
		return nil, nil, err
	}
	return hooks, e, nil
}

// openEgress opens the secrets, loads the proxy's CA from the state root (making it on first
// use) and the host's roots, with the file --egress-ca-file names added, to verify the hosts
// it connects to.
func openEgress(o *options, uses func(string) []secret.Use, log *slog.Logger) (*egressService, error) {
	secrets, err := openSecrets(o, uses, log)
	if err != nil {
		return nil, err
	}
	ca, err := egress.LoadCA(o.root)
	if err != nil {
		return nil, err
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if o.egressCAFile != "" {
		pem, err := os.ReadFile(o.egressCAFile)
		if err != nil {
			return nil, fmt.Errorf("--egress-ca-file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--egress-ca-file %s holds no PEM certificate", o.egressCAFile)
		}
	}
	e := &egressService{secrets: secrets, ca: ca, log: log, served: map[string]*egress.Sandbox{}}
	e.proxy = egress.New(egress.Config{CA: ca, Value: secrets.Value, Roots: roots, Log: log})
	return e, nil
}

// bindings are a sandbox's bindings as the proxy takes them, with its placeholders.
func (e *egressService) bindings(id string, in []network.SecretBinding) []egress.Binding {
	out := make([]egress.Binding, 0, len(in))
	for _, b := range in {
		eb := egress.Binding{Secret: b.Secret, Hosts: b.Hosts, Placeholder: e.secrets.Placeholder(id, b.Secret)}
		if b.Header != nil {
			eb.Header = &egress.Header{Name: b.Header.Name, Value: b.Header.Value}
		}
		out = append(out, eb)
	}
	return out
}

// Serve implements network.Egress.
func (e *egressService) Serve(id string, ln net.Listener, secrets []network.SecretBinding, allowed func(netip.AddrPort) bool) error {
	sb := e.proxy.Serve(id, ln, e.bindings(id, secrets), allowed)
	e.mu.Lock()
	old := e.served[id]
	e.served[id] = sb
	e.mu.Unlock()
	if old != nil {
		old.Close()
	}
	e.log.Info("egress: serving the sandbox's secrets", "sandbox", id, "listener", ln.Addr().String())
	return nil
}

// Update implements network.Egress.
func (e *egressService) Update(id string, secrets []network.SecretBinding) {
	e.mu.Lock()
	sb := e.served[id]
	e.mu.Unlock()
	if sb != nil {
		sb.Update(e.bindings(id, secrets))
	}
}

// Stop implements network.Egress.
func (e *egressService) Stop(id string) {
	e.mu.Lock()
	sb := e.served[id]
	delete(e.served, id)
	e.mu.Unlock()
	if sb != nil {
		sb.Close()
	}
}

// Exists implements supervisor.Secrets.
func (e *egressService) Exists(name string) bool { return e.secrets.Exists(name) }

// Placeholder implements supervisor.Secrets.
func (e *egressService) Placeholder(sandbox, name string) string {
	return e.secrets.Placeholder(sandbox, name)
}

// CACert implements supervisor.Secrets.
func (e *egressService) CACert() []byte { return e.ca.CertPEM() }

// secretUses lists the sandboxes whose policy binds a secret, for the secrets' answers and
// their delete's refusal; sup is read when asked, as it is made after the secrets.
func secretUses(sup **supervisor.Supervisor) func(name string) []secret.Use {
	return func(name string) []secret.Use {
		if *sup == nil {
			return nil
		}
		list, err := (*sup).List()
		if err != nil {
			return nil
		}
		var out []secret.Use
		for _, st := range list {
			if st.Network == nil {
				continue
			}
			for _, b := range st.Network.Policy.Secrets {
				if b.Secret == name {
					out = append(out, secret.Use{Sandbox: st.Config.ID, Hosts: b.Hosts})
				}
			}
		}
		return out
	}
}

// checkEgress is the egress CA's check as the checker takes it (check.StoreCheck).
func checkEgress(root string) check.StoreCheck {
	return func(repair bool) ([]check.Problem, bool, error) {
		found, err := egress.Check(root, repair)
		out := make([]check.Problem, 0, len(found))
		for _, f := range found {
			out = append(out, check.Problem{Kind: egress.Leftover, Entry: f, Detail: "a temporary file of an interrupted write of the CA", Repaired: repair})
		}
		return out, false, err
	}
}
