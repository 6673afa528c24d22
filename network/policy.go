package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/bothy/bothy/errcode"
)

// MaxEntries bounds each of a policy's lists: every entry becomes set elements or rules in the
// kernel, and a policy is a short list of intentions, not a block list.
const MaxEntries = 256

// Policy is a sandbox's egress policy as the API carries it. The zero Policy means no network:
// the sandbox has no interface but lo. Use [Parse] to validate it into [Rules].
type Policy struct {
	// Internet with an empty Allow makes every public destination reachable.
	Internet bool `json:"internet"`
	// Allow, when not empty, lists the only destinations reachable, whatever Internet says.
	Allow []string `json:"allow,omitempty"`
	// Deny wins over Allow and over Internet.
	Deny []string `json:"deny,omitempty"`
	// Secrets are the secrets the egress proxy sends, for the sandbox, to the hosts each names
	// (docs/secrets.md). The API's form is a map by name, which package handlers converts.
	Secrets []SecretBinding `json:"-"`
}

// SecretBinding binds a secret to hosts: the egress proxy replaces its placeholder with its
// value in requests to them, and sets Header when given.
type SecretBinding struct {
	Secret string        `json:"secret"`
	Hosts  []string      `json:"hosts"`
	Header *SecretHeader `json:"header,omitempty"`
}

// SecretHeader is a header set on every request to a bound host; "{value}" in Value stands
// for the secret's value.
type SecretHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Bounds of the secrets of a policy.
const (
	// MaxSecretBindings bounds a policy's secrets, and MaxSecretHosts each one's hosts: each
	// host is matched against every intercepted request.
	MaxSecretBindings = 16
	MaxSecretHosts    = 16
	// maxHeaderValue bounds a bound header's template.
	maxHeaderValue = 256
)

// Kind says what an [Entry] names.
type Kind int

// The kinds of entry, in the order [ParseEntry] tries them.
const (
	// Prefix is a CIDR, or a bare address taken as a prefix of its full length.
	Prefix Kind = iota + 1
	// AddrPort is one address and one port, for TCP and UDP alike.
	AddrPort
	// Domain is one exact name.
	Domain
	// Wildcard ("*.example.org") is every name below a domain, at any depth, but not the domain
	// itself.
	Wildcard
)

// Entry is one parsed element of an allow or deny list.
type Entry struct {
	Kind Kind
	// Text is the entry as written, for messages.
	Text string
	// Prefix is set for Prefix (always masked) and AddrPort (the address's full prefix).
	Prefix netip.Prefix
	// Port is set for AddrPort.
	Port uint16
	// Name is set for Domain (the name) and Wildcard (the domain below which names match); it
	// is lower case, without a final dot.
	Name string
}

// Rules is a validated [Policy]. Its zero value denies everything and means no network.
type Rules struct {
	Internet    bool
	Allow, Deny []Entry
	// Secrets are the policy's secret bindings, their hosts lower case without a final dot.
	Secrets []SecretBinding
}

// Networked reports whether the rules give the sandbox any destination at all, and so an
// interface: a policy that allows nothing keeps the default of no interface but lo.
func (r *Rules) Networked() bool { return r != nil && (r.Internet || len(r.Allow) > 0) }

// Policy returns the rules in the API's form, each entry as it was written.
func (r *Rules) Policy() Policy {
	p := Policy{Internet: r.Internet}
	for _, e := range r.Allow {
		p.Allow = append(p.Allow, e.Text)
	}
	for _, e := range r.Deny {
		p.Deny = append(p.Deny, e.Text)
	}
	p.Secrets = r.Secrets
	return p
}

// alwaysDenied are the IPv4 ranges no policy can open: "this network", loopback, link-local
// (which holds the cloud metadata address 169.254.169.254), multicast, and the reserved range
// with the broadcast address. The host's own addresses and the pool of sandbox addresses are
// added by the [Manager], which knows them.
var alwaysDenied = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// privateRanges are denied unless an allow entry lies inside one of them (RFC 1918 and the
// shared address space of RFC 6598, where carrier-grade NAT and many VPNs live). An entry that
// merely covers one, such as 0.0.0.0/0, does not open it: reaching a private network must be
// asked for by naming it.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
}

// within reports whether p lies inside one of ranges.
func within(p netip.Prefix, ranges []netip.Prefix) bool {
	for _, r := range ranges {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// overlaps reports whether p and one of ranges share an address.
func overlaps(p netip.Prefix, ranges []netip.Prefix) bool {
	for _, r := range ranges {
		if r.Overlaps(p) {
			return true
		}
	}
	return false
}

// Private reports whether an entry's addresses lie in a private range, which the entry then
// opens (when allowed).
func (e Entry) Private() bool {
	return (e.Kind == Prefix || e.Kind == AddrPort) && within(e.Prefix, privateRanges)
}

// Parse validates p into [Rules]. The error is an errcode.InvalidRequest naming the field and
// the first bad entry (network.allow[2], say) and what is wrong with it.
func Parse(p Policy) (*Rules, error) {
	r := &Rules{Internet: p.Internet}
	lists := []struct {
		field   string
		entries []string
		out     *[]Entry
		allow   bool
	}{
		{"network.allow", p.Allow, &r.Allow, true},
		{"network.deny", p.Deny, &r.Deny, false},
	}
	for _, l := range lists {
		if len(l.entries) > MaxEntries {
			return nil, errcode.Invalid(l.field, "%s has %d entries; at most %d are allowed. Use CIDRs or wildcards to say it in fewer.",
				l.field, len(l.entries), MaxEntries)
		}
		for i, text := range l.entries {
			field := fmt.Sprintf("%s[%d]", l.field, i)
			e, err := ParseEntry(text)
			if err != nil {
				return nil, errcode.Invalid(field, "%s is %q: %v.", field, text, err)
			}
			if l.allow && (e.Kind == Prefix || e.Kind == AddrPort) && within(e.Prefix, alwaysDenied) {
				return nil, errcode.Invalid(field, "%s is %q, which is always denied (loopback, link-local and cloud metadata, "+
					"multicast and reserved addresses are never reachable from a sandbox); remove it.", field, text)
			}
			*l.out = append(*l.out, e)
		}
	}
	secrets, err := parseSecrets(p.Secrets)
	if err != nil {
		return nil, err
	}
	r.Secrets = secrets
	return r, nil
}

// parseSecrets validates a policy's secret bindings. A binding opens nothing: a bound host the
// policy does not allow is refused by the sandbox's resolver, so never intercepted, and a
// policy without a network binds nothing at all.
func parseSecrets(bindings []SecretBinding) ([]SecretBinding, error) {
	if len(bindings) == 0 {
		return nil, nil
	}
	if len(bindings) > MaxSecretBindings {
		return nil, errcode.Invalid("network.secrets", "network.secrets has %d entries; at most %d are allowed.", len(bindings), MaxSecretBindings)
	}
	seen := map[string]bool{}
	out := make([]SecretBinding, 0, len(bindings))
	for _, b := range bindings {
		field := "network.secrets." + b.Secret
		if !validSecretName(b.Secret) {
			return nil, errcode.Invalid("network.secrets", "network.secrets names %q, not a secret's name (a letter, then at most 63 letters, digits or underscores).", b.Secret)
		}
		if seen[b.Secret] {
			return nil, errcode.Invalid(field, "network.secrets names %q a second time; bind each secret once, with all its hosts.", b.Secret)
		}
		seen[b.Secret] = true
		if len(b.Hosts) == 0 || len(b.Hosts) > MaxSecretHosts {
			return nil, errcode.Invalid(field+".hosts", "%s.hosts has %d entries; give 1 to %d.", field, len(b.Hosts), MaxSecretHosts)
		}
		nb := SecretBinding{Secret: b.Secret}
		for j, h := range b.Hosts {
			hf := fmt.Sprintf("%s.hosts[%d]", field, j)
			// A host is a name, as the TLS connection names it; one that looks like an address
			// never matches a server name, and binds nothing.
			name := strings.TrimSuffix(strings.ToLower(h), ".")
			wild := false
			if rest, ok := strings.CutPrefix(name, "*."); ok {
				name, wild = rest, true
			}
			if err := checkDomain(name); err != nil {
				return nil, errcode.Invalid(hf, "%s is %q: %v.", hf, h, err)
			}
			if wild {
				nb.Hosts = append(nb.Hosts, "*."+name)
			} else {
				nb.Hosts = append(nb.Hosts, name)
			}
		}
		if b.Header != nil {
			if err := checkSecretHeader(field+".header", *b.Header); err != nil {
				return nil, err
			}
			hd := *b.Header
			nb.Header = &hd
		}
		out = append(out, nb)
	}
	return out, nil
}

func validSecretName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || (c < '0' || c > '9') && c != '_') {
			return false
		}
	}
	return true
}

// checkSecretHeader refuses a header the proxy must not set: one that frames or routes the
// request, or that is not a token; and a template without the value or with a line break.
func checkSecretHeader(field string, h SecretHeader) error {
	if h.Name == "" || len(h.Name) > 64 {
		return errcode.Invalid(field+".name", "%s.name must have 1 to 64 characters.", field)
	}
	for i := 0; i < len(h.Name); i++ {
		c := h.Name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+.^_`|~-", c) >= 0) {
			return errcode.Invalid(field+".name", "%s.name %q is not an HTTP header name.", field, h.Name)
		}
	}
	switch strings.ToLower(h.Name) {
	case "host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive", "proxy-connection":
		return errcode.Invalid(field+".name", "%s.name is %q, which frames or routes the request; the proxy does not set it.", field, h.Name)
	}
	if len(h.Value) > maxHeaderValue || !strings.Contains(h.Value, "{value}") || strings.ContainsAny(h.Value, "\r\n\x00") {
		return errcode.Invalid(field+".value", "%s.value must hold {value}, where the secret's value goes (as \"Bearer {value}\"), have at most %d characters and no line break.", field, maxHeaderValue)
	}
	return nil
}

// ParseEntry parses one allow or deny entry: a CIDR ("198.51.100.0/24"), an address
// ("198.51.100.7"), an address and port ("198.51.100.7:443"), a domain ("example.com") or a
// wildcard ("*.example.org"). Only IPv4 destinations are accepted, as sandboxes have no IPv6
// path yet; the error says why an entry is refused, as a phrase that fits after the entry.
func ParseEntry(text string) (Entry, error) {
	e := Entry{Text: text}
	if text == "" {
		return e, fmt.Errorf("empty; give a domain, a CIDR or an address:port")
	}
	if p, err := netip.ParsePrefix(text); err == nil {
		// Bits beyond the prefix length are ignored, as iptables and nftables ignore them:
		// 10.0.0.1/8 is 10.0.0.0/8. The contract's pattern cannot tell them apart, and a
		// request it takes is not refused (issue 38).
		e.Kind, e.Prefix = Prefix, p.Masked()
		return e, ipv4Only(p.Addr())
	}
	if ap, err := netip.ParseAddrPort(text); err == nil {
		if ap.Port() == 0 {
			return e, fmt.Errorf("an address with port 0; give a port from 1 to 65535")
		}
		a := ap.Addr().Unmap()
		e.Kind, e.Prefix, e.Port = AddrPort, netip.PrefixFrom(a, a.BitLen()), ap.Port()
		return e, ipv4Only(a)
	}
	if a, err := netip.ParseAddr(text); err == nil {
		a = a.Unmap()
		e.Kind, e.Prefix = Prefix, netip.PrefixFrom(a, a.BitLen())
		return e, ipv4Only(a)
	}
	name := strings.TrimSuffix(strings.ToLower(text), ".")
	e.Kind = Domain
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		e.Kind, name = Wildcard, rest
	}
	if err := checkDomain(name); err != nil {
		return e, err
	}
	e.Name = name
	return e, nil
}

func ipv4Only(a netip.Addr) error {
	if !a.Is4() {
		return fmt.Errorf("an IPv6 destination, and sandboxes have no IPv6 path yet; use an IPv4 address or a domain")
	}
	return nil
}

// checkDomain checks the form of a domain name (RFC 1123 labels; an underscore is allowed, as
// service names use it).
func checkDomain(name string) error {
	if name == "" {
		return fmt.Errorf("not a domain, a CIDR or an address:port")
	}
	if len(name) > 253 {
		return fmt.Errorf("a name longer than 253 characters")
	}
	if strings.Contains(name, ":") {
		return fmt.Errorf("a name with a port; ports go only with addresses (198.51.100.7:443)")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("not a domain: every label must have 1 to 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("not a domain: a label starts or ends with '-'")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c == '*':
				return fmt.Errorf("a wildcard that is not the whole first label; write *.example.org")
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			default:
				return fmt.Errorf("not a domain: %q is not a letter, digit, '-' or '_'", c)
			}
		}
	}
	return nil
}

// matches reports whether e is a domain or wildcard entry that covers the name of labels
// (lower case, root last, as [hostLabels] gives them). The comparison is label by label: a
// wildcard covers names with more labels than its domain whose last labels are the domain's.
func (e Entry) matches(labels []string) bool {
	if e.Kind != Domain && e.Kind != Wildcard {
		return false
	}
	zone := strings.Split(e.Name, ".")
	if e.Kind == Domain {
		return slices.Equal(labels, zone)
	}
	return len(labels) > len(zone) && slices.Equal(labels[len(labels)-len(zone):], zone)
}

// hostLabels returns the labels of a queried name in the presentation form miekg/dns gives
// (dns.Name: a label's dot, space, backslash and other special or unprintable bytes escaped,
// as "evil\.allowed.test."), lower case, or false when the name is not a host name: a label
// holds a byte other than a letter, a digit, '-' or '_' (so every escaped byte, a dot inside a
// label first among them), or a label is empty or too long. Such a name is refused whatever
// the policy: matched as text, "evil\.allowed.test." would end in ".allowed.test" while its
// labels on the wire are "evil.allowed" and "test", a name outside allowed.test. The root
// name has no labels.
func hostLabels(name string) ([]string, bool) {
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return nil, true
	}
	if len(name) > 253 {
		return nil, false
	}
	b := []byte(name)
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return nil, false
		}
	}
	labels := strings.Split(string(b), ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return nil, false
		}
	}
	return labels, true
}

// AllowsName reports whether the sandbox's resolver answers name (in miekg/dns's presentation
// form, see [hostLabels]): never when it is not a host name or a deny entry covers it; when the
// allow list is not empty, only if an allow entry covers it; otherwise if the sandbox has the
// internet. Addresses are judged apart, by the filter, when connected to.
func (r *Rules) AllowsName(name string) bool {
	if r == nil {
		return false
	}
	labels, ok := hostLabels(name)
	if !ok {
		return false
	}
	for _, e := range r.Deny {
		if e.matches(labels) {
			return false
		}
	}
	if len(r.Allow) == 0 {
		return r.Internet
	}
	for _, e := range r.Allow {
		if e.matches(labels) {
			return true
		}
	}
	return false
}

// pins reports whether the resolver must add the answers of allowed names to the sandbox's
// allowed set: only when an allow list names domains, since with the internet and no allow
// list every public address is open anyway.
func (r *Rules) pins() bool {
	for _, e := range r.Allow {
		if e.Kind == Domain || e.Kind == Wildcard {
			return true
		}
	}
	return false
}

// bindsName reports whether a secret of the rules is bound to the name (miekg/dns's form).
func (r *Rules) bindsName(name string) bool {
	labels, ok := hostLabels(name)
	if !ok || r == nil {
		return false
	}
	for _, b := range r.Secrets {
		for _, h := range b.Hosts {
			e := Entry{Kind: Domain, Name: h}
			if rest, ok := cutWildcard(h); ok {
				e = Entry{Kind: Wildcard, Name: rest}
			}
			if e.matches(labels) {
				return true
			}
		}
	}
	return false
}

func cutWildcard(h string) (string, bool) {
	if len(h) > 2 && h[:2] == "*." {
		return h[2:], true
	}
	return "", false
}
