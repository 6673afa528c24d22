// Package naming holds the naming rules that every side of bothyd shares: the shape of an
// id (sandbox ids, template names), what counts as a clean absolute path, and fresh random
// names. It exists so that the stores, the runtime, the agent and the server check one rule
// instead of each keeping a copy that could drift from the others.
//
// It is a leaf: it imports only the standard library, never another package of bothyd, so
// that sandbox-side packages (the agent, the runtime, platform) and host-side ones (the stores,
// the server) can all use it without importing each other. It says whether a string breaks a
// rule and which part; the wording of errors for an API or a log is its callers' business.
//
// The id rule is part of the API contract (the ids of openapi/openapi.yaml have the pattern
// ^[a-z0-9][a-z0-9-]{0,62}$) and of the on-disk layout, where an id is one path component:
// changing it changes both.
package naming

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// MaxIDLen is the longest id, in bytes (all of an id's characters are ASCII).
const MaxIDLen = 63

// Fault says which part of the id rule a string breaks.
type Fault int

// The faults CheckID reports, in the order it looks for them.
const (
	// Empty: the id has no character.
	Empty Fault = iota + 1
	// TooLong: the id has more than MaxIDLen bytes.
	TooLong
	// LeadingDash: the id starts with '-'.
	LeadingDash
	// BadChar: the id has a byte other than a-z, 0-9 and '-'.
	BadChar
)

func (f Fault) String() string {
	switch f {
	case Empty:
		return "empty"
	case TooLong:
		return "too long"
	case LeadingDash:
		return "leading dash"
	case BadChar:
		return "bad character"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// IDError is the error of CheckID: the id and the first part of the rule it breaks.
type IDError struct {
	ID    string
	Fault Fault
	// Char is the first byte that is not allowed, for BadChar. It is a byte, not a rune: an id
	// with a non-ASCII character is refused at that character's first byte.
	Char byte
}

func (e *IDError) Error() string {
	switch e.Fault {
	case Empty:
		return "naming: the id is empty"
	case TooLong:
		return fmt.Sprintf("naming: the id has %d characters, more than %d", len(e.ID), MaxIDLen)
	case LeadingDash:
		return fmt.Sprintf("naming: the id %q starts with '-'", e.ID)
	}
	return fmt.Sprintf("naming: the id %q contains %q", e.ID, string(rune(e.Char)))
}

// CheckID checks s against the id rule: 1 to MaxIDLen characters of a-z, 0-9 and '-',
// starting with a letter or a digit. Such an id is safe as one path component (it is never
// "." or "..", never has '/' or NUL) and as a hostname label. The error, if any, is an
// *[IDError] naming the first fault: Empty, then TooLong, then the first byte that is a
// LeadingDash or a BadChar.
func CheckID(s string) error {
	if s == "" {
		return &IDError{ID: s, Fault: Empty}
	}
	if len(s) > MaxIDLen {
		return &IDError{ID: s, Fault: TooLong}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0:
		case c == '-':
			return &IDError{ID: s, Fault: LeadingDash, Char: c}
		default:
			return &IDError{ID: s, Fault: BadChar, Char: c}
		}
	}
	return nil
}

// ValidID reports whether s follows the id rule of [CheckID].
func ValidID(s string) bool { return CheckID(s) == nil }

// IsCleanAbs reports whether p is an absolute path in the form filepath.Clean gives it: no
// "." or ".." element, no doubled or trailing separator. Such a path means the same directory
// to every process whatever its working directory, and can be compared as a string.
func IsCleanAbs(p string) bool { return filepath.IsAbs(p) && filepath.Clean(p) == p }

// RandomHex returns n random bytes from crypto/rand as 2n lowercase hexadecimal digits, for
// names that must not collide (temp names, staging directories, lease ids, request ids).
// It never fails: crypto/rand.Read always fills its buffer, and crashes the program rather
// than return an error when the system cannot supply randomness.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RandomAlnum returns n random characters of a-z and 0-9 from crypto/rand, for ids that a
// user reads and types: each carries a little under log2(36) ≈ 5.2 bits (256 % 36 = 4, so the
// first four letters are a little likelier, which costs under a bit of an id's entropy).
func RandomAlnum(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// The label rules, part of the API contract (openapi/openapi.yaml's Labels, LabelKey and
// LabelValue): every way a sandbox gets labels (bothyd's create, E2B's metadata) checks them
// here, so that none is looser than another.
const (
	// MaxLabels is the most labels a sandbox has.
	MaxLabels = 64
	// MaxLabelLen is the longest label key, and the longest label value.
	MaxLabelLen = 63
)

var (
	labelKey   = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
	labelValue = regexp.MustCompile(`^[A-Za-z0-9._-]{0,63}$`)
)

// ValidLabelKey reports whether k is a label key: 1-63 of a-z 0-9 . _ / -, starting and
// ending with a letter or a digit.
func ValidLabelKey(k string) bool { return labelKey.MatchString(k) }

// ValidLabelValue reports whether v is a label value: up to 63 of A-Z a-z 0-9 . _ -.
func ValidLabelValue(v string) bool { return labelValue.MatchString(v) }

// CheckLabels says which rule labels break, as a sentence a caller can put in its answer,
// or returns nil. Keys are checked in sorted order, so that the answer does not vary.
func CheckLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("there are %d labels, more than the %d a sandbox may have", len(labels), MaxLabels)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !ValidLabelKey(k) {
			return fmt.Errorf("the label key %q is not valid: use 1-63 of a-z 0-9 . _ / - starting and ending with a letter or digit", k)
		}
		if !ValidLabelValue(labels[k]) {
			return fmt.Errorf("the value of label %q is not valid: use up to 63 of A-Z a-z 0-9 . _ -", k)
		}
	}
	return nil
}

// The environment rules of the API contract (openapi/openapi.yaml's EnvVar): every way a
// sandbox or a process gets an environment checks them here.
const (
	// MaxEnv is the most variables a sandbox's environment has.
	MaxEnv = 256
	// MaxEnvEntry is the longest KEY=VALUE entry.
	MaxEnvEntry = 32768
)

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)

// CheckEnv says which rule env breaks, as a sentence, or returns nil.
func CheckEnv(env map[string]string) error {
	if len(env) > MaxEnv {
		return fmt.Errorf("there are %d environment variables, more than the %d allowed", len(env), MaxEnv)
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := env[k]
		switch {
		case !envKey.MatchString(k):
			return fmt.Errorf("the environment variable name %q is not valid: use letters, digits and '_', not starting with a digit, at most 256", k)
		case len(k)+1+len(v) > MaxEnvEntry:
			return fmt.Errorf("the environment variable %s is longer than %d bytes", k, MaxEnvEntry)
		case strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("the value of the environment variable %s holds a NUL byte", k)
		}
	}
	return nil
}
