package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// Names in the state root.
const (
	// Dir is the directory of the secrets in the state root.
	Dir = "secrets"
	// KeyName is the key file in Dir.
	KeyName = "key"

	recordFormat = 1
	recordExt    = ".json"
	keySize      = 32
)

// Bounds of the store.
const (
	// MaxSecrets bounds the secrets of a server.
	MaxSecrets = 256
	// MaxValueBytes bounds a value: API keys and tokens are far shorter; a value is held in
	// the proxy's memory for every request that carries it.
	MaxValueBytes = 8 << 10
	// MaxNameLength bounds a name (it becomes part of an environment variable's name).
	MaxNameLength = 64
	// PlaceholderPrefix starts every placeholder.
	PlaceholderPrefix = "bothy-secret-"
	// PlaceholderLength is the length of a placeholder.
	PlaceholderLength = len(PlaceholderPrefix) + 32
	// EnvPrefix starts the environment variable that holds a placeholder in a sandbox.
	EnvPrefix = "BOTHY_SECRET_"
)

// NamePattern is the form of a name: a letter, then letters, digits and underscores, as an
// environment variable's name has (the sandbox sees BOTHY_SECRET_<NAME>).
var NamePattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,63}$`)

// Use is one sandbox whose network policy binds a secret, and to which hosts.
type Use struct {
	Sandbox string
	Hosts   []string
}

// Secret is a secret as the API shows it: never its value.
type Secret struct {
	Name      string
	CreatedAt time.Time
	// RotatedAt is the time of the last rotation; nil when the value is the first one.
	RotatedAt *time.Time
	// Version counts the values: 1 for the first, one more at each rotation.
	Version int
	// Uses are the sandboxes that bind it.
	Uses []Use
}

// Options configure a Manager.
type Options struct {
	// Root is the state root; the secrets are in Root/secrets.
	Root string
	// Uses lists the sandboxes that bind a secret; nil: none does.
	Uses   func(name string) []Use
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// rec is <name>.json.
type rec struct {
	Format int    `json:"format"`
	Name   string `json:"name"`
	// Sealed is the nonce followed by the AES-GCM ciphertext of the value, in hex.
	Sealed    string     `json:"sealed"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at,omitempty"`
	Version   int        `json:"version,omitempty"`
}

// Manager keeps the secrets of a state root.
type Manager struct {
	o   Options
	dir string
	log *slog.Logger

	mu      sync.Mutex
	aead    cipher.AEAD // nil until the key exists
	phKey   []byte      // the placeholders' key, derived from the key
	secrets map[string]*rec
}

// Open loads the secrets of o.Root and removes what interrupted writes left. The key is read
// if it exists; it is made at the first create.
func Open(o Options) (*Manager, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Uses == nil {
		o.Uses = func(string) []Use { return nil }
	}
	if err := platform.EnsureDir(o.Root, Dir, 0o700); err != nil {
		return nil, fmt.Errorf("secret: the records directory: %w", err)
	}
	m := &Manager{o: o, dir: filepath.Join(o.Root, Dir), log: o.Logger, secrets: map[string]*rec{}}
	probs, key, err := scan(m.dir, true, func(r *rec) { m.secrets[r.Name] = r })
	if err != nil {
		return nil, err
	}
	for _, p := range probs {
		if p.Repaired {
			m.log.Info("secrets: removed what an interrupted write left", "entry", filepath.Join(Dir, p.Entry), "what", p.Detail)
		} else {
			m.log.Warn("secrets: a record cannot be used; bothyd check reports it", "entry", filepath.Join(Dir, p.Entry), "problem", p.Detail)
		}
	}
	if key != nil {
		if err := m.useKey(key); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Manager) useKey(key []byte) error {
	block, err := aes.NewCipher(key)
	if err != nil {
		return fmt.Errorf("secret: the key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return fmt.Errorf("secret: the key: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("bothy placeholders v1"))
	m.aead, m.phKey = aead, mac.Sum(nil)
	return nil
}

// ensureKey makes the key, durably, if there is none yet. m.mu is held.
func (m *Manager) ensureKey() error {
	if m.aead != nil {
		return nil
	}
	key := make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	if err := platform.WriteFileDurable(m.dir, KeyName, key, 0o600); err != nil {
		return errcode.Storage(fmt.Errorf("secrets' key could not be written: %w", err), m.o.Root)
	}
	return m.useKey(key)
}

// ValidName reports whether name has the form of a secret's name.
func ValidName(name string) bool { return NamePattern.MatchString(name) }

func checkName(name string) error {
	if !ValidName(name) {
		return errcode.Invalid("name", "A secret's name is a letter followed by at most %d letters, digits or underscores (it becomes the environment variable %s<NAME> in a sandbox); choose another.",
			MaxNameLength-1, EnvPrefix)
	}
	return nil
}

// checkValue refuses a value out of bounds, never quoting it.
func checkValue(value string) error {
	switch {
	case value == "":
		return errcode.Invalid("value", "A secret's value must not be empty.")
	case len(value) > MaxValueBytes:
		return errcode.Invalid("value", "A secret's value may have at most %d bytes; this one has %d.", MaxValueBytes, len(value))
	case strings.Contains(value, PlaceholderPrefix):
		return errcode.Invalid("value", "A secret's value must not contain %q, the start of a placeholder.", PlaceholderPrefix)
	}
	return nil
}

func notFound(name string) error {
	return errcode.New(errcode.SecretNotFound, "There is no secret %q; list them with GET /v1/secrets.", name)
}

// Create stores a new secret. Its value is sealed and written durably before it returns.
func (m *Manager) Create(name, value string) (*Secret, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	s, err := m.create(name, value)
	if err != nil {
		return nil, err
	}
	return m.withUses(s), nil
}

func (m *Manager) create(name, value string) (*Secret, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.secrets[name]; ok {
		return nil, errcode.New(errcode.SecretExists, "A secret %q exists; rotate it with POST /v1/secrets/%s/rotate, or delete it first.", name, name)
	}
	if len(m.secrets) >= MaxSecrets {
		return nil, errcode.New(errcode.LimitReached, "This server holds %d secrets, as many as it may; delete one first.", MaxSecrets)
	}
	if err := m.ensureKey(); err != nil {
		return nil, err
	}
	r := &rec{Format: recordFormat, Name: name, CreatedAt: m.o.Now().UTC(), Version: 1}
	if err := m.write(r, value); err != nil {
		return nil, err
	}
	m.secrets[name] = r
	return m.show(r), nil
}

// Rotate replaces a secret's value; the proxy sends the new one from the next request on.
func (m *Manager) Rotate(name, value string) (*Secret, error) {
	if err := checkValue(value); err != nil {
		return nil, err
	}
	s, err := m.rotate(name, value)
	if err != nil {
		return nil, err
	}
	return m.withUses(s), nil
}

func (m *Manager) rotate(name, value string) (*Secret, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.secrets[name]
	if !ok {
		return nil, notFound(name)
	}
	now := m.o.Now().UTC()
	r := &rec{Format: recordFormat, Name: name, CreatedAt: old.CreatedAt, RotatedAt: &now, Version: max(old.Version, 1) + 1}
	if err := m.write(r, value); err != nil {
		return nil, err
	}
	m.secrets[name] = r
	return m.show(r), nil
}

// write seals value into r and writes r durably. m.mu is held.
func (m *Manager) write(r *rec, value string) error {
	nonce := make([]byte, m.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	r.Sealed = hex.EncodeToString(m.aead.Seal(nonce, nonce, []byte(value), []byte(r.Name)))
	data, err := record.Encode(r)
	if err != nil {
		return err
	}
	if err := platform.WriteFileDurable(m.dir, r.Name+recordExt, data, record.Perm); err != nil {
		return errcode.Storage(fmt.Errorf("secret could not be written: %w", err), m.o.Root)
	}
	return nil
}

// Get shows one secret.
func (m *Manager) Get(name string) (*Secret, error) {
	m.mu.Lock()
	r, ok := m.secrets[name]
	m.mu.Unlock()
	if !ok {
		return nil, notFound(name)
	}
	return m.withUses(m.show(r)), nil
}

// List shows every secret, by name.
func (m *Manager) List() []Secret {
	m.mu.Lock()
	out := make([]Secret, 0, len(m.secrets))
	for _, r := range m.secrets {
		out = append(out, *m.show(r))
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Secret) int { return strings.Compare(a.Name, b.Name) })
	for i := range out {
		out[i] = *m.withUses(&out[i])
	}
	return out
}

// Exists reports whether a secret of this name exists.
func (m *Manager) Exists(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.secrets[name]
	return ok
}

// Delete removes a secret. A secret that a sandbox's policy binds is refused (secret-in-use):
// the sandbox's requests would otherwise go out with the placeholder where the caller expects
// the value, a failure far from its cause; change or delete those sandboxes first.
//
// The sandboxes are asked without m's lock held: the supervisor that answers may be waiting,
// in a launch, for a placeholder, which takes it.
func (m *Manager) Delete(name string) error {
	if !m.Exists(name) {
		return notFound(name)
	}
	if uses := m.o.Uses(name); len(uses) > 0 {
		ids := make([]string, 0, len(uses))
		for _, u := range uses {
			ids = append(ids, u.Sandbox)
		}
		return errcode.New(errcode.SecretInUse, "The secret %q is bound by the network policy of sandbox %s; delete those sandboxes or change their policies first.",
			name, strings.Join(ids, ", "))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.secrets[name]; !ok {
		return notFound(name)
	}
	if err := os.Remove(filepath.Join(m.dir, name+recordExt)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return errcode.Storage(fmt.Errorf("secret could not be deleted: %w", err), m.o.Root)
	}
	if d, err := platform.OpenDir(m.dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return errcode.Storage(fmt.Errorf("secret's deletion could not be made durable: %w", err), m.o.Root)
		}
	}
	delete(m.secrets, name)
	return nil
}

// show is r as answers show it, without its uses. m.mu is held.
func (m *Manager) show(r *rec) *Secret {
	return &Secret{Name: r.Name, CreatedAt: r.CreatedAt, RotatedAt: r.RotatedAt, Version: max(r.Version, 1)}
}

// withUses adds to s the sandboxes that bind it, asked without m's lock held.
func (m *Manager) withUses(s *Secret) *Secret {
	s.Uses = m.o.Uses(s.Name)
	if s.Uses == nil {
		s.Uses = []Use{}
	}
	return s
}

// Value returns a secret's value, for the egress proxy alone: it must go nowhere but into a
// request to a host the secret is bound to.
func (m *Manager) Value(name string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.secrets[name]
	if !ok || m.aead == nil {
		return "", false
	}
	sealed, err := hex.DecodeString(r.Sealed)
	if err != nil || len(sealed) < m.aead.NonceSize() {
		return "", false
	}
	ns := m.aead.NonceSize()
	plain, err := m.aead.Open(nil, sealed[:ns], sealed[ns:], []byte(r.Name))
	if err != nil {
		m.log.Warn("secrets: a sealed value does not open under the key; it is not sent", "secret", r.Name)
		return "", false
	}
	return string(plain), true
}

// Placeholder returns the placeholder that stands for the secret name in the sandbox id, or
// "" before the key exists (no secret was ever created, so none can be bound).
func (m *Manager) Placeholder(sandbox, name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.phKey == nil {
		return ""
	}
	mac := hmac.New(sha256.New, m.phKey)
	mac.Write([]byte(sandbox))
	mac.Write([]byte{0})
	mac.Write([]byte(name))
	return PlaceholderPrefix + hex.EncodeToString(mac.Sum(nil))[:PlaceholderLength-len(PlaceholderPrefix)]
}
