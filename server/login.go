package server

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/bothy/bothy/errcode"
)

// DefaultLoginTTL is how long a dashboard login code stays good, unused.
const DefaultLoginTTL = 15 * time.Minute

// NewSecret returns n random bytes in hex: tokens and login codes.
func NewSecret(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// IssueLogin makes a one-time code that POST /login exchanges, once and within ttl, for the
// server's token: the dashboard's login URL carries it, so that the URL can be printed where
// the token itself must not be (a log). A new code replaces the one before it. It fails on a
// server without a token, which has nothing to log in to.
func (s *Server) IssueLogin(ttl time.Duration) (string, error) {
	if s.token == "" {
		return "", errors.New("server: a server without a token has no login")
	}
	code, err := NewSecret(16)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loginCode = code
	s.loginExpires = s.now().Add(ttl)
	return code, nil
}

// redeemLogin reports whether code is the outstanding login code, and spends it if so.
func (s *Server) redeemLogin(code string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loginCode == "" {
		return false
	}
	if !s.now().Before(s.loginExpires) {
		s.loginCode = ""
		return false
	}
	if subtle.ConstantTimeCompare([]byte(code), []byte(s.loginCode)) != 1 {
		// A wrong guess does not spend the code: a code has 128 random bits, and spending it
		// would let any local client lock the operator out of the link.
		return false
	}
	s.loginCode = ""
	return true
}

// login is POST /login: {"code": "..."} in, {"token": "..."} out, once per code.
func (s *Server) login(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Code string `json:"code"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&in); err != nil {
		return errcode.Wrap(errcode.InvalidRequest, err, "The login request could not be decoded: send {\"code\": \"...\"}.")
	}
	if !s.redeemLogin(in.Code) {
		return errcode.New(errcode.Unauthorized,
			"This login link was used already, has expired, or is not this server's; restart bothyd for a new one, or paste the token from the token file in its state root.")
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	return json.NewEncoder(w).Encode(map[string]string{"token": s.token})
}
