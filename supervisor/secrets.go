package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/store"
)

// A sandbox whose network policy binds secrets (network.secrets) gets, at each start:
//
//   - in its environment, BOTHY_SECRET_<NAME> holding the secret's placeholder for this
//     sandbox (never the value), and the usual variables naming a CA bundle that holds the
//     egress proxy's CA (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, GIT_SSL_CAINFO,
//     and NODE_EXTRA_CA_CERTS, which Node.js adds to its own roots);
//   - in its files, written as root through the agent over whatever the image has, the
//     image's bundle with the proxy's CA added ([caPaths]) and the CA alone at
//     [caOnlyPath].
//
// The values stay with the proxy (package egress); the CA's key never leaves the state root.

// SecretBinding and SecretHeader are a policy's binding of a secret, as recorded.
type (
	SecretBinding = store.SecretBinding
	SecretHeader  = store.SecretHeader
)

// Secrets is what the supervisor needs of the secrets and the egress proxy's CA.
type Secrets interface {
	// Exists reports whether a secret of this name exists.
	Exists(name string) bool
	// Placeholder is what sandbox holds in place of the secret name.
	Placeholder(sandbox, name string) string
	// CACert is the egress proxy's CA certificate, PEM.
	CACert() []byte
}

const (
	// caBundlePath is the bundle the environment names: Debian's and Alpine's path.
	caBundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// caOnlyPath holds the proxy's CA alone, for NODE_EXTRA_CA_CERTS. It is under /etc, which
	// every runtime gives the sandbox to write (/usr may be the host's, read-only).
	caOnlyPath = "/etc/bothy/egress-ca.crt"
	// maxBundleBytes bounds the image's bundle read to add the CA to.
	maxBundleBytes = 4 << 20
)

// caPaths are the trust stores of the common distributions; the first is written whether or
// not the image has it, the others only where the image has them.
var caPaths = []string{caBundlePath, "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// bindingsOf is the network package's form of recorded bindings.
func bindingsOf(in []store.SecretBinding) []network.SecretBinding {
	var out []network.SecretBinding
	for _, b := range in {
		nb := network.SecretBinding{Secret: b.Secret, Hosts: b.Hosts}
		if b.Header != nil {
			nb.Header = &network.SecretHeader{Name: b.Header.Name, Value: b.Header.Value}
		}
		out = append(out, nb)
	}
	return out
}

// checkSecrets refuses bindings this server cannot honour: no proxy, or a secret that does
// not exist (create it first).
func (s *Supervisor) checkSecrets(rules *network.Rules) error {
	if len(rules.Secrets) == 0 {
		return nil
	}
	if s.secrets == nil {
		return errcode.Invalid("network.secrets", "This server has no egress proxy, so a policy cannot bind secrets; leave out network.secrets.")
	}
	for _, b := range rules.Secrets {
		if !s.secrets.Exists(b.Secret) {
			return errcode.New(errcode.SecretNotFound, "The policy binds the secret %q, and there is none; create it with POST /v1/secrets first.", b.Secret)
		}
	}
	return nil
}

// secretEnv adds to env the placeholders and CA variables of cfg's bindings.
func (s *Supervisor) secretEnv(cfg *store.Config, env map[string]string) map[string]string {
	if s.secrets == nil || cfg.Network == nil || len(cfg.Network.Secrets) == 0 || !s.networked(cfg) {
		return env
	}
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	for _, b := range cfg.Network.Secrets {
		out["BOTHY_SECRET_"+b.Secret] = s.secrets.Placeholder(cfg.ID, b.Secret)
	}
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"} {
		out[k] = caBundlePath
	}
	out["NODE_EXTRA_CA_CERTS"] = caOnlyPath
	return out
}

// installCA adds the proxy's CA to the sandbox's trust stores, once: a bundle that holds it
// already (a restart keeps the sandbox's own layer) is left as it is.
func (s *Supervisor) installCA(ctx context.Context, client *control.Client) error {
	if s.secrets == nil {
		return errors.New("no egress proxy")
	}
	ca := s.secrets.CACert()
	write := func(path string, data []byte) error {
		_, err := client.WriteFile(ctx, control.WriteRequest{Path: path, User: "root", Mode: 0o644, MakeParents: true}, bytes.NewReader(data))
		return err
	}
	if err := write(caOnlyPath, ca); err != nil {
		return err
	}
	for i, path := range caPaths {
		old, found, err := readBounded(ctx, client, path)
		if err != nil {
			return err
		}
		if (!found && i > 0) || bytes.Contains(old, ca) {
			continue
		}
		if len(old) > 0 && !bytes.HasSuffix(old, []byte("\n")) {
			old = append(old, '\n')
		}
		if err := write(path, append(old, ca...)); err != nil {
			if i == 0 {
				return err
			}
			// Another distribution's store, on a file system the sandbox cannot write: the
			// environment names the first, which was written.
			s.log.Debug("egress: a trust store of the sandbox was not written", "path", path, "err", err)
		}
	}
	return nil
}

// readBounded reads a file of the sandbox, at most maxBundleBytes; found is false when it does
// not exist.
func readBounded(ctx context.Context, client *control.Client, path string) (data []byte, found bool, err error) {
	r, _, err := client.ReadFile(ctx, path, "root")
	if err != nil {
		if errors.Is(err, errcode.FileNotFound) {
			return nil, false, nil
		}
		return nil, false, err
	}
	defer r.Close()
	data, err = io.ReadAll(io.LimitReader(r, maxBundleBytes+1))
	if err != nil {
		return nil, true, err
	}
	if len(data) > maxBundleBytes {
		return nil, true, fmt.Errorf("%s is larger than %d bytes", path, maxBundleBytes)
	}
	return data, true, nil
}

// checkLiveSecrets refuses a live policy change that changes which secrets are bound: a
// running sandbox's environment holds the placeholders of its start, and the CA went into
// its trust store then. The hosts and headers of the secrets it binds may change live.
func checkLiveSecrets(id string, cfg *store.Config, rules *network.Rules) error {
	var had []string
	if cfg.Network != nil {
		for _, b := range cfg.Network.Secrets {
			had = append(had, b.Secret)
		}
	}
	var want []string
	for _, b := range rules.Secrets {
		want = append(want, b.Secret)
	}
	slices.Sort(had)
	slices.Sort(want)
	if !slices.Equal(had, want) {
		return errcode.Invalid("network.secrets", "Sandbox %s runs with the placeholders of the secrets it bound at its start; stop it to change which secrets network.secrets names (their hosts and headers may change while it runs).", id)
	}
	return nil
}
