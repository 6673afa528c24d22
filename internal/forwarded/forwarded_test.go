package forwarded

import (
	"net/http"
	"testing"
)

func TestForwardedClient(t *testing.T) {
	h := http.Header{}
	h.Set(Header, "203.0.113.9 forged")
	Set(h, "node-token", "198.51.100.7")
	if got, ok := Client(h, "node-token"); !ok || got != "198.51.100.7" {
		t.Fatalf("the proxy's own name: %q %v", got, ok)
	}
	if _, ok := Client(h, "another-token"); ok {
		t.Fatal("a name proved under another token was believed")
	}
	if _, ok := Client(h, ""); ok {
		t.Fatal("a server without a token believed a name")
	}
	// The proof covers the name: another name with this proof is refused.
	v := h.Get(Header)
	h.Set(Header, "198.51.100.8"+v[len("198.51.100.7"):])
	if _, ok := Client(h, "node-token"); ok {
		t.Fatal("a proof moved to another name was believed")
	}
	for _, bad := range []string{"", "198.51.100.7", "198.51.100.7 ", "not-an-ip " + proof("node-token", "not-an-ip"), "::ffff:1.2.3.4 " + proof("node-token", "::ffff:1.2.3.4")} {
		h.Set(Header, bad)
		if _, ok := Client(h, "node-token"); ok {
			t.Fatalf("%q was believed", bad)
		}
	}
	// A mapped IPv4 address is forwarded as IPv4; a non-address is not forwarded at all.
	Set(h, "node-token", "::ffff:192.0.2.1")
	if got, ok := Client(h, "node-token"); !ok || got != "192.0.2.1" {
		t.Fatalf("a mapped address: %q %v", got, ok)
	}
	Set(h, "node-token", "[2001:db8::1]:4242")
	if got, ok := Client(h, "node-token"); !ok || got != "2001:db8::1" {
		t.Fatalf("a remote address with its port: %q %v", got, ok)
	}
	Set(h, "node-token", "client.example")
	if h.Get(Header) != "" {
		t.Fatalf("a host name was forwarded: %q", h.Get(Header))
	}
	Set(h, "", "192.0.2.1")
	if h.Get(Header) != "" {
		t.Fatal("a name was forwarded without a token")
	}
}
