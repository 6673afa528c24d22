// Package forwarded names the client that a proxy in front of bothyd (the cluster router)
// forwards a request for, so that the node's per-client bounds count each client of the
// router on its own instead of all of them as the router's one address.
//
// A header anyone could set would let a client escape its bounds by naming another address
// in each request, so the name carries proof that the proxy holds the node's API token: an
// HMAC of the name under that token. Only routers hold a node's token (clients hold the
// router's), and the proof covers the name alone, so a header replayed from elsewhere can
// only ever claim the one client it was made for. Without a token (a node on loopback that
// asks for none) nothing is forwarded and nothing is believed.
package forwarded

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Header carries "<client IP> <proof>".
const Header = "Bothy-Client"

// proof is the HMAC-SHA256 of the client's name under the token, base64url without padding.
func proof(token, client string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("bothy-forwarded-client\x00" + client))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Set names the client at remote (a request's RemoteAddr, "ip:port", or an IP address;
// anything else is not forwarded) in h under token, and removes any name the request carried
// already: a client's own header never passes a proxy.
func Set(h http.Header, token, remote string) {
	h.Del(Header)
	if host, _, err := net.SplitHostPort(remote); err == nil {
		remote = host
	}
	addr, err := netip.ParseAddr(remote)
	if token == "" || err != nil {
		return
	}
	name := addr.Unmap().String()
	h.Set(Header, name+" "+proof(token, name))
}

// Client answers the client h names, when its proof holds under token.
func Client(h http.Header, token string) (string, bool) {
	v := h.Get(Header)
	if token == "" || v == "" || len(v) > 128 {
		return "", false
	}
	name, got, ok := strings.Cut(v, " ")
	if !ok {
		return "", false
	}
	if addr, err := netip.ParseAddr(name); err != nil || addr.Unmap().String() != name {
		return "", false
	}
	if !hmac.Equal([]byte(got), []byte(proof(token, name))) {
		return "", false
	}
	return name, true
}
