// Package secret keeps the values that sandboxes may send to named hosts without ever holding
// them: API keys and tokens, created and rotated through /v1/secrets, encrypted at rest, and
// handed only to the egress proxy (package egress), which fills them into requests on their
// way out of a sandbox. It knows nothing of HTTP serving or of sandboxes beyond a name: the
// supervisor says which sandboxes bind a secret ([Options].Uses).
//
// It must never put a value into an answer, a log line, an event or an error: [Secret] has no
// field for it, and the one way to read a value is [Manager.Value], which the proxy alone
// calls.
//
// # Records
//
// Everything lives in <root>/secrets (mode 0700):
//
//	key           32 random bytes, the key of every value (mode 0600)
//	<name>.json   a secret: its name, its value sealed under key, its creation and rotation times (mode 0600)
//
// The key is written durably (platform.WriteFileDurable: temporary file, fsync, rename, fsync
// of the directory) the first time a secret is created, before any value is sealed under it,
// so that no record on disk can name a key that a crash lost. A secret's record is written
// durably before its create or rotate is answered; a delete removes it, durably, before it is
// answered. The start-up and `bothyd check --repair` ([Check]) remove the temporary files of
// interrupted writes; a record that does not read, or a record without a key, is reported and
// left to the operator.
//
// # Encryption
//
// A value is sealed with AES-256-GCM (the standard library's crypto/aes and crypto/cipher)
// under the key, with a fresh random 96-bit nonce and the secret's name as additional data,
// so that a record copied under another name does not open. AES-GCM rather than x/crypto's
// ChaCha20-Poly1305: it needs no new dependency, runs on the AES instructions of every host
// bothyd targets, and the number of values sealed under one key (one per create or rotate,
// with at most [MaxSecrets] alive) stays far below the 2^32 random nonces that bound it. The
// encryption keeps a value out of backups, copies and captures of the state root made
// without the key file; whoever reads the key file (root on the host) can open every value,
// as it can read bothyd's memory.
//
// # Placeholders
//
// A sandbox sees, for each secret its policy binds, an opaque placeholder in its environment
// (BOTHY_SECRET_<NAME>), [Manager.Placeholder]: "bothy-secret-" and 32 hex digits of an
// HMAC-SHA256 of the sandbox's id and the secret's name under a key derived from the key
// file. It is the same after a restart of bothyd (nothing more to record), differs between
// sandboxes (one sandbox cannot spend another's), and says nothing of the value.
package secret
