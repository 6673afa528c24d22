// Package egress is bothyd's egress proxy: it puts secrets (package secret) into a sandbox's
// HTTPS requests on their way out, toward the hosts the secret is bound to and no other, so
// that the sandbox holds only a placeholder. It is host-side, and knows nothing of the API or
// of the supervisor: package network redirects the connections to it, and the caller says
// which sandbox binds what ([Proxy.Serve], [Binding]).
//
// It must never connect anywhere the sandbox's filter would not have let the sandbox connect,
// never put a value into a request to a host it is not bound to, never let a CA key or a value
// into a sandbox, and never let a sandbox hold more of it than its bounds.
//
// # Path
//
// A sandbox whose policy binds a secret has its TCP connections to port 443 of the addresses
// its resolver answered for a bound host name redirected (nftables dnat) to a listener of its
// own on its gateway; every other connection, and every sandbox without a binding, never meets
// the proxy. The proxy reads where each connection was going from the connection tracking
// entry (SO_ORIGINAL_DST), reads the TLS ClientHello (at most [MaxHelloBytes]) and:
//
//   - when no binding covers its server name (SNI), or the bytes are no TLS, connects to the
//     original destination and copies the bytes both ways untouched: no interception;
//   - when one does, completes the handshake with a leaf certificate for that name signed by
//     this host's CA ([CA]), and serves HTTP/1.1 on it: each request goes to the original
//     destination (never to what a Host header names), over TLS verified for the server name
//     against the host's roots ([Config].Roots), with every bound placeholder replaced by its
//     value in the URL, the headers and the body, and the bound headers set. A request whose
//     Host is not the server name is refused (421): the value goes only where both say.
//
// Bodies stream: the replacement holds back at most the placeholder's length between reads,
// so a placeholder split across two writes is found, and nothing is buffered whole. Answers
// get the reverse replacement (a value echoed back becomes its placeholder again).
//
// # The CA
//
// [LoadCA] makes, on first use, an ECDSA P-256 key (ca.key, mode 0600, in <root>/egress) and
// a self-signed certificate (ca.crt), each written durably before use. Only the certificate
// enters sandboxes. Leaf certificates live 24 hours, are made again after 12, and at most
// [MaxLeaves] are kept.
package egress
