package network

import (
	"errors"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
)

func TestParseRefusesBadEntries(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		p     Policy
		field string
		says  string
	}{
		{"empty entry", Policy{Allow: []string{""}}, "network.allow[0]", "empty"},
		{"port zero", Policy{Deny: []string{"198.51.100.7:0"}}, "network.deny[0]", "port 0"},
		{"ipv6", Policy{Allow: []string{"2001:db8::/32"}}, "network.allow[0]", "IPv6"},
		{"metadata", Policy{Allow: []string{"169.254.169.254"}}, "network.allow[0]", "always denied"},
		{"loopback", Policy{Allow: []string{"127.0.0.0/8"}}, "network.allow[0]", "always denied"},
		{"inner wildcard", Policy{Allow: []string{"a.*.example.org"}}, "network.allow[0]", "wildcard"},
		{"domain with port", Policy{Allow: []string{"example.com:443"}}, "network.allow[0]", "port"},
		{"bad char", Policy{Allow: []string{"exa mple.com"}}, "network.allow[0]", "not a letter"},
		{"dash", Policy{Allow: []string{"-example.com"}}, "network.allow[0]", "'-'"},
		{"empty label", Policy{Allow: []string{"example..com"}}, "network.allow[0]", "1 to 63"},
		{"too many", Policy{Deny: make([]string, MaxEntries+1)}, "network.deny", "at most"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tc.p)
			var e *errcode.Error
			if !errors.As(err, &e) || e.Code != errcode.InvalidRequest {
				t.Fatalf("Parse(%+v) = %v, want an invalid-request error", tc.p, err)
			}
			if e.Field != tc.field || !strings.Contains(e.Msg, tc.says) || !strings.Contains(e.Msg, tc.field) {
				t.Fatalf("error field %q message %q, want field %q and a message naming it and saying %q", e.Field, e.Msg, tc.field, tc.says)
			}
		})
	}
}

// TestParseMasksHostBits: a CIDR with bits beyond its prefix length is the network it names,
// as iptables reads it: the contract's pattern takes it, so the server does too (issue 38).
func TestParseMasksHostBits(t *testing.T) {
	t.Parallel()
	e, err := ParseEntry("198.51.100.7/24")
	if err != nil || e.Kind != Prefix || e.Prefix.String() != "198.51.100.0/24" {
		t.Fatalf("ParseEntry(198.51.100.7/24) = %+v, %v; want the prefix 198.51.100.0/24", e, err)
	}
}

func TestParseEntryKinds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		text    string
		kind    Kind
		name    string
		port    uint16
		private bool
	}{
		{"198.51.100.0/24", Prefix, "", 0, false},
		{"198.51.100.7", Prefix, "", 0, false},
		{"10.1.2.0/24", Prefix, "", 0, true},
		{"0.0.0.0/0", Prefix, "", 0, false}, // covering a private range does not open it
		{"192.168.1.5:8080", AddrPort, "", 8080, true},
		{"Example.COM.", Domain, "example.com", 0, false},
		{"*.example.org", Wildcard, "example.org", 0, false},
	}
	for _, tc := range cases {
		e, err := ParseEntry(tc.text)
		if err != nil {
			t.Fatalf("ParseEntry(%q): %v", tc.text, err)
		}
		if e.Kind != tc.kind || e.Name != tc.name || e.Port != tc.port || e.Private() != tc.private {
			t.Errorf("ParseEntry(%q) = %+v (private %v), want kind %d name %q port %d private %v",
				tc.text, e, e.Private(), tc.kind, tc.name, tc.port, tc.private)
		}
	}
}

func TestAllowsName(t *testing.T) {
	t.Parallel()
	mustParse := func(p Policy) *Rules {
		r, err := Parse(p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	list := mustParse(Policy{Allow: []string{"example.com", "*.example.org", "198.51.100.0/24"}, Deny: []string{"bad.example.org"}})
	internet := mustParse(Policy{Internet: true, Deny: []string{"*.tracker.test"}})
	none := mustParse(Policy{})
	cases := []struct {
		rules *Rules
		name  string
		want  bool
	}{
		{list, "example.com.", true},
		{list, "EXAMPLE.com", true},
		{list, "www.example.com", false}, // an exact name covers no other
		{list, "a.b.example.org", true},
		{list, "example.org", false}, // a wildcard does not cover its apex
		{list, "bad.example.org", false},
		{list, "other.test", false},
		{internet, "anything.test", true},
		{internet, "x.tracker.test", false},
		{none, "example.com", false},
		// Names are matched on their labels, and a name that is not a host name is refused
		// whatever the policy. miekg/dns presents a label's dot escaped: the wire labels of
		// `x\.example.org.` are "x.example" and "org", a name outside example.org whose
		// text ends in ".example.org".
		{list, `x\.example.org.`, false},
		{list, `evil\.com.example.org.`, false},
		{list, `a\000b.example.org.`, false},
		{list, `a\ b.example.org.`, false},
		{list, "a..example.org", false},
		{list, "A.B.Example.ORG.", true},
		{list, "_srv._tcp.example.org.", true},
		{internet, `evil\.com.`, false},
		{internet, strings.Repeat("a", 64) + ".test", false},
		{nil, "example.com", false},
	}
	for _, tc := range cases {
		if got := tc.rules.AllowsName(tc.name); got != tc.want {
			t.Errorf("AllowsName(%q) under %+v = %v, want %v", tc.name, tc.rules.Policy(), got, tc.want)
		}
	}
	if none.Networked() || !list.Networked() || !internet.Networked() {
		t.Errorf("Networked: none %v list %v internet %v, want false true true", none.Networked(), list.Networked(), internet.Networked())
	}
	if got := list.Policy(); strings.Join(got.Allow, ",") != "example.com,*.example.org,198.51.100.0/24" || got.Deny[0] != "bad.example.org" {
		t.Errorf("Policy() = %+v, want the entries as written", got)
	}
}

func TestParseSecrets(t *testing.T) {
	t.Parallel()
	allow := []string{"api.example.com", "*.example.org"}
	bind := func(b ...SecretBinding) Policy { return Policy{Allow: allow, Secrets: b} }
	hdr := &SecretHeader{Name: "Authorization", Value: "Bearer {value}"}
	bad := []struct {
		name  string
		p     Policy
		field string
	}{
		{"bad name", bind(SecretBinding{Secret: "1K", Hosts: []string{"api.example.com"}}), "network.secrets"},
		{"twice", bind(SecretBinding{Secret: "K", Hosts: []string{"api.example.com"}}, SecretBinding{Secret: "K", Hosts: []string{"api.example.com"}}), "network.secrets.K"},
		{"no hosts", bind(SecretBinding{Secret: "K"}), "network.secrets.K.hosts"},
		{"bad host", bind(SecretBinding{Secret: "K", Hosts: []string{"a..b"}}), "network.secrets.K.hosts[0]"},
		{"host header", bind(SecretBinding{Secret: "K", Hosts: []string{"api.example.com"}, Header: &SecretHeader{Name: "Host", Value: "{value}"}}), "network.secrets.K.header.name"},
		{"no value", bind(SecretBinding{Secret: "K", Hosts: []string{"api.example.com"}, Header: &SecretHeader{Name: "X-Key", Value: "static"}}), "network.secrets.K.header.value"},
		{"line break", bind(SecretBinding{Secret: "K", Hosts: []string{"api.example.com"}, Header: &SecretHeader{Name: "X-Key", Value: "{value}\r\nX-Evil: 1"}}), "network.secrets.K.header.value"},
		{"too many", bind(make([]SecretBinding, MaxSecretBindings+1)...), "network.secrets"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tc.p)
			var e *errcode.Error
			if !errors.As(err, &e) || e.Code != errcode.InvalidRequest || e.Field != tc.field {
				t.Fatalf("Parse = %v, want invalid-request on %s", err, tc.field)
			}
		})
	}
	r, err := Parse(bind(SecretBinding{Secret: "K", Hosts: []string{"API.Example.com.", "*.Example.org"}, Header: hdr}))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Secrets[0].Hosts; len(got) != 2 || got[0] != "api.example.com" || got[1] != "*.example.org" {
		t.Fatalf("hosts %v", got)
	}
	for name, want := range map[string]bool{"api.example.com.": true, "x.example.org.": true, "example.org.": false, "other.example.com.": false} {
		if r.bindsName(name) != want {
			t.Errorf("bindsName(%s) = %v", name, !want)
		}
	}
	if p := r.Policy(); len(p.Secrets) != 1 {
		t.Fatalf("the policy lost its secrets: %+v", p)
	}
	// A binding opens nothing, so a host the policy does not allow, or a policy without a
	// network, is taken: the name is never resolved, so never intercepted.
	if _, err := Parse(Policy{Secrets: []SecretBinding{{Secret: "K", Hosts: []string{"evil.test"}}}}); err != nil {
		t.Fatalf("a binding without a network: %v", err)
	}
}
