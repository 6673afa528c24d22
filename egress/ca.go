package egress

import (
	"container/list"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/bothy/bothy/platform"
)

// Names in the state root.
const (
	// Dir is the proxy's directory in the state root.
	Dir = "egress"
	// CAKeyName and CACertName are the CA's key (mode 0600, never in a sandbox) and
	// certificate (what sandboxes trust).
	CAKeyName  = "ca.key"
	CACertName = "ca.crt"
)

// Bounds of the CA.
const (
	// MaxLeaves bounds the leaf certificates kept: one per bound host name, the least
	// recently used going first.
	MaxLeaves = 1024
	// leafLifetime is how long a leaf is valid; it is made again after half of it.
	leafLifetime = 24 * time.Hour
	caLifetime   = 10 * 365 * 24 * time.Hour
)

// CA is this host's certificate authority for the proxy's interceptions: it signs, for a host
// name a secret is bound to, the leaf certificate the proxy shows the sandbox.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
	leafKey *ecdsa.PrivateKey // shared by every leaf: the CA's signature is what binds a name

	mu     sync.Mutex
	leaves map[string]*list.Element
	lru    *list.List // of *leaf, most recent first
	now    func() time.Time
}

type leaf struct {
	name    string
	cert    *tls.Certificate
	renewAt time.Time
}

// LoadCA reads the CA of the state root, making it on first use: the key and then the
// certificate are written durably before either is used, so that a sandbox never trusts a
// certificate whose key a crash lost. A key without its certificate (a crash between the two
// writes) gets a new certificate.
func LoadCA(root string) (*CA, error) {
	if err := platform.EnsureDir(root, Dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress: the CA's directory: %w", err)
	}
	dir := filepath.Join(root, Dir)
	if _, err := Check(root, true); err != nil {
		return nil, fmt.Errorf("egress: remove what interrupted writes left: %w", err)
	}
	key, err := loadKey(dir)
	if err != nil {
		return nil, err
	}
	certPEM, err := platform.ReadFile(filepath.Join(dir, CACertName), 64<<10)
	var cert *x509.Certificate
	if err == nil {
		cert, err = parseCert(certPEM)
		if err == nil && !publicKeysEqual(cert.PublicKey, key.Public()) {
			err = errors.New("the certificate is not the key's")
		}
	}
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("egress: the CA's certificate %s: %w; remove it (and the sandboxes that trust it) to make a new one", filepath.Join(dir, CACertName), err)
		}
		if cert, certPEM, err = newCACert(key); err != nil {
			return nil, err
		}
		if err := platform.WriteFileDurable(dir, CACertName, certPEM, 0o644); err != nil {
			return nil, fmt.Errorf("egress: the CA's certificate: %w", err)
		}
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: certPEM, key: key, leafKey: leafKey,
		leaves: map[string]*list.Element{}, lru: list.New(), now: time.Now}, nil
}

func loadKey(dir string) (crypto.Signer, error) {
	data, err := platform.ReadFile(filepath.Join(dir, CAKeyName), 64<<10)
	if errors.Is(err, fs.ErrNotExist) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, err
		}
		pemKey := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
		if err := platform.WriteFileDurable(dir, CAKeyName, pemKey, 0o600); err != nil {
			return nil, fmt.Errorf("egress: the CA's key: %w", err)
		}
		return k, nil
	}
	if err != nil {
		return nil, fmt.Errorf("egress: the CA's key: %w", err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("egress: the CA's key %s is not PEM; remove it to make a new CA", filepath.Join(dir, CAKeyName))
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress: the CA's key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("egress: the CA's key cannot sign")
	}
	return s, nil
}

func newCACert(key crypto.Signer) (*x509.Certificate, []byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"bothy"}, CommonName: "bothy egress CA " + host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func parseCert(data []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ka, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ka.Equal(b)
}

// CertPEM is the CA's certificate, PEM-encoded: what a sandbox's trust store adds.
func (c *CA) CertPEM() []byte { return c.certPEM }

// Leaf returns a certificate for name signed by the CA, from the cache when it has one
// that is not past half its life.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	now := c.now()
	c.mu.Lock()
	if e, ok := c.leaves[name]; ok {
		l := e.Value.(*leaf)
		if now.Before(l.renewAt) {
			c.lru.MoveToFront(e)
			c.mu.Unlock()
			return l.cert, nil
		}
		c.lru.Remove(e)
		delete(c.leaves, name)
	}
	c.mu.Unlock()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, c.leafKey.Public(), c.key)
	if err != nil {
		return nil, err
	}
	cert := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.leaves[name]; ok { // made meanwhile by another connection
		c.lru.Remove(e)
	}
	c.leaves[name] = c.lru.PushFront(&leaf{name: name, cert: cert, renewAt: now.Add(leafLifetime / 2)})
	for c.lru.Len() > MaxLeaves {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.leaves, old.Value.(*leaf).name)
	}
	return cert, nil
}

// Leftover is the kind of problem [Check] finds: a temporary file of an interrupted write.
const Leftover = "egress-leftover"

// Check removes the temporary files of interrupted writes of the CA in root, with repair,
// and returns what it found (names relative to root).
func Check(root string, repair bool) (found []string, err error) {
	dir := filepath.Join(root, Dir)
	names, err := platform.ListDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := platform.IsTempName(n); !ok {
			continue
		}
		found = append(found, filepath.Join(Dir, n))
		if repair {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return found, err
			}
		}
	}
	return found, nil
}
