// Package portlink keeps the signed, expiring, revocable links that open one port of one
// sandbox to whoever holds them, without the API token: for sharing a preview. A link is a
// record in the state root (so that a restart keeps it, and keeps a revocation too) and a
// token, `<id>.<signature>`, whose signature is an HMAC over the record made with a secret of
// the server's, kept beside the records (mode 0600, made on the first start). A token is
// good only while its record exists, is unexpired, and signs to it; nothing else about the
// server can be derived from it, and it reaches nothing but its port.
//
// A link is bound to its sandbox's creation time as well as its id, so that a sandbox deleted
// and created again under the same id does not inherit the links of the old one.
//
// # Links in a cluster
//
// A node of a cluster (docs/cluster.md) makes ids that begin with its node's tag, NodeTag of
// its name, followed by random hex: a router, which keeps no record of links, finds the node
// that holds a link from its token alone, and the node still checks the whole token (the id
// is signed with the rest). A server outside a cluster makes ids of random hex alone.
//
// It imports no HTTP package; package handlers serves links.
package portlink

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// Names in the state root.
const (
	KeyName   = "port-links.key"
	LinksName = "port-links.json"
)

// Bounds of links.
const (
	DefaultTTL = time.Hour
	MaxTTL     = 7 * 24 * time.Hour
	// MaxLinks bounds the live links of the server, and so the records file.
	MaxLinks = 1000
	// MaxLinksPerSandbox bounds one sandbox's share of them.
	MaxLinksPerSandbox = 100
)

// Link is one link's record.
type Link struct {
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	// SandboxCreated is the sandbox's creation time: the link is void for a later sandbox of
	// the same id.
	SandboxCreated time.Time `json:"sandbox_created"`
	Port           int       `json:"port"`
	CreatedAt      time.Time `json:"created_at"`
	ExpiresAt      time.Time `json:"expires_at"`
}

// IDLen is the length of a link's id, in hex digits; TagLen that of a node's tag, which begins
// the id of a link made by a node of a cluster.
const (
	IDLen  = 32
	TagLen = 16
)

// NodeTag is the tag of the cluster node called name: the first TagLen hex digits of a
// SHA-256 of the name. A hash, not the name, so that an id keeps its length and alphabet
// whatever the name (up to 253 characters), and a link's holder does not read the name in
// it; 64 bits, so that two nodes of one cluster do not share a tag in practice.
func NodeTag(name string) string {
	sum := sha256.Sum256([]byte("bothy port link node\n" + name))
	return hex.EncodeToString(sum[:])[:TagLen]
}

// Store holds the links of one state root. It is safe for concurrent use by one process.
type Store struct {
	root string
	key  []byte
	now  func() time.Time
	// tag begins the ids of new links: NodeTag of the node's name in a cluster, else empty.
	tag string

	mu    sync.Mutex
	links map[string]Link
}

// Open loads the links of root, making the signing secret first if there is none.
func Open(root string) (*Store, error) {
	key, err := loadKey(root)
	if err != nil {
		return nil, err
	}
	s := &Store{root: root, key: key, now: time.Now, links: map[string]Link{}}
	b, err := os.ReadFile(filepath.Join(root, LinksName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("portlink: reading the links: %w", err)
	default:
		var list []Link
		if err := json.Unmarshal(b, &list); err != nil {
			return nil, fmt.Errorf("portlink: %s is malformed: %w", LinksName, err)
		}
		for _, l := range list {
			s.links[l.ID] = l
		}
	}
	return s, nil
}

// OpenNode is Open for the node called node of a cluster: the ids of the links it makes
// begin with the node's tag (NodeTag), by which a router finds the node.
func OpenNode(root, node string) (*Store, error) {
	s, err := Open(root)
	if err != nil {
		return nil, err
	}
	if node != "" {
		s.tag = NodeTag(node)
	}
	return s, nil
}

// TokenTag is the node's tag that begins token's id, for a router; false when token is no
// token's shape. It checks nothing else: the node that holds the link checks the token.
func TokenTag(token string) (string, bool) {
	id, _, ok := strings.Cut(token, ".")
	if !ok || len(id) != IDLen {
		return "", false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	return id[:TagLen], true
}

// loadKey reads the signing secret, or makes it: written whole to a temporary file, synced,
// then linked to its name, which fails if another process made it first (then theirs is
// used). A crash leaves no secret or a whole one.
func loadKey(root string) ([]byte, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("portlink: creating the state root: %w", err)
	}
	path := filepath.Join(root, KeyName)
	if key, err := readKey(path); !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(root, ".port-links-key-*") // mode 0600
	if err != nil {
		return nil, fmt.Errorf("portlink: writing the secret: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(hex.EncodeToString(raw) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("portlink: writing the secret: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("portlink: writing the secret: %w", err)
	}
	if d, err := os.Open(root); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return nil, fmt.Errorf("portlink: syncing the state root: %w", err)
		}
	}
	return readKey(path)
}

// readKey reads a secret that only its owner may read: a secret others can read is refused,
// since anyone who has it can sign links.
func readKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("portlink: %s must be a regular file of mode 0600 (it is %v); remove it to have a new one made", path, fi.Mode())
	}
	b := make([]byte, 128)
	n, _ := f.Read(b)
	key, err := hex.DecodeString(strings.TrimSpace(string(b[:n])))
	if err != nil || len(key) < 32 {
		return nil, fmt.Errorf("portlink: %s does not hold a secret of 32 bytes in hex; remove it to have a new one made", path)
	}
	return key, nil
}

// sign is the token's signature of l.
func (s *Store) sign(l Link) string {
	m := hmac.New(sha256.New, s.key)
	fmt.Fprintf(m, "bothyd port link v1\n%s\n%s\n%d\n%d\n%d\n", l.ID, l.Sandbox, l.SandboxCreated.UnixNano(), l.Port, l.ExpiresAt.UnixNano())
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Token is l's token.
func (s *Store) Token(l Link) string { return l.ID + "." + s.sign(l) }

// Create records a new link to port of the sandbox, valid for ttl (0: DefaultTTL; at most
// MaxTTL), and returns it with its token. The record is durable before it returns.
func (s *Store) Create(sandbox string, sandboxCreated time.Time, port int, ttl time.Duration) (Link, string, error) {
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < time.Second || ttl > MaxTTL {
		return Link{}, "", errcode.Invalid("ttl_s", "A link lives between 1 second and %d seconds; give a ttl_s in that range.", int(MaxTTL.Seconds()))
	}
	now := s.now().UTC().Truncate(time.Second)
	l := Link{Sandbox: sandbox, SandboxCreated: sandboxCreated, Port: port, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked()
	for {
		// 64 random bits or more after a node's tag: a repeat is as good as impossible,
		// but it would replace a live link's record, so a taken id is drawn again.
		raw := make([]byte, (IDLen-len(s.tag))/2)
		if _, err := rand.Read(raw); err != nil {
			return Link{}, "", err
		}
		l.ID = s.tag + hex.EncodeToString(raw)
		if _, taken := s.links[l.ID]; !taken {
			break
		}
	}
	n := 0
	for _, o := range s.links {
		if o.Sandbox == sandbox {
			n++
		}
	}
	if n >= MaxLinksPerSandbox || len(s.links) >= MaxLinks {
		return Link{}, "", errcode.New(errcode.LimitReached,
			"Sandbox %s has %d live links (the server %d), as many as allowed (%d per sandbox, %d in all); revoke some, or let them expire.", sandbox, n, len(s.links), MaxLinksPerSandbox, MaxLinks)
	}
	s.links[l.ID] = l
	if err := s.saveLocked(); err != nil {
		delete(s.links, l.ID)
		return Link{}, "", err
	}
	return l, s.Token(l), nil
}

// Revoke removes the link id of the sandbox's port, durably: its token stops working at once,
// and after a restart too.
func (s *Store) Revoke(sandbox string, port int, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.links[id]
	if !ok || l.Sandbox != sandbox || l.Port != port {
		return errcode.New(errcode.LinkNotFound, "Port %d of sandbox %s has no link %q; it may have expired.", port, sandbox, id)
	}
	delete(s.links, id)
	if err := s.saveLocked(); err != nil {
		s.links[id] = l
		return err
	}
	return nil
}

// List returns the live links of the sandbox made at sandboxCreated, of port only when port is
// not 0, oldest first (ties by id). Links of an earlier sandbox of the same id are void and not
// listed, nor are expired ones. The records carry no token; a list never makes one.
func (s *Store) List(sandbox string, sandboxCreated time.Time, port int) []Link {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked()
	out := []Link{}
	for _, l := range s.links {
		if l.Sandbox == sandbox && l.SandboxCreated.Equal(sandboxCreated) && (port == 0 || l.Port == port) {
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Resolve returns the link a token stands for, if it is recorded, signed by this server and
// unexpired. Every failure is the same link-not-found, so a token's holder learns nothing
// of why.
func (s *Store) Resolve(token string) (Link, error) {
	notFound := errcode.New(errcode.LinkNotFound, "This link does not exist, has expired or was revoked; ask for a new one.")
	id, sig, ok := strings.Cut(token, ".")
	if !ok || len(id) != IDLen || len(sig) > 64 {
		return Link{}, notFound
	}
	s.mu.Lock()
	l, ok := s.links[id]
	s.mu.Unlock()
	if !ok || !hmac.Equal([]byte(sig), []byte(s.sign(l))) || !s.now().Before(l.ExpiresAt) {
		return Link{}, notFound
	}
	return l, nil
}

// pruneLocked forgets expired links; the next save drops them from the file.
func (s *Store) pruneLocked() {
	now := s.now()
	for id, l := range s.links {
		if !now.Before(l.ExpiresAt) {
			delete(s.links, id)
		}
	}
}

func (s *Store) saveLocked() error {
	list := make([]Link, 0, len(s.links))
	for _, l := range s.links {
		list = append(list, l)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	if err := platform.WriteFileDurable(s.root, LinksName, b, 0o600); err != nil {
		return errcode.Storage(fmt.Errorf("portlink: recording the links: %w", err), s.root)
	}
	return nil
}

// String names a link for logs, without its token.
func (l Link) String() string { return l.Sandbox + ":" + strconv.Itoa(l.Port) + "/" + l.ID }
