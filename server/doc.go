// Package server builds bothyd's http.Handler: the chi router, the middleware (request id,
// access log, panic recovery, origin and host checks, bearer-token auth, request validation
// against the OpenAPI contract, body limits), the routes that live outside the generated strict
// interface, and the one place where errors become application/problem+json responses.
//
// It must not know how sandboxes work: it calls the handlers package through the generated
// interface ([openapi.StrictServerInterface], in [Config].Handlers) and maps the typed errors
// ([errcode.Error]) that come back. docs/design.md has the error table.
//
// # Errors
//
// Every error response, whatever produced it (a malformed JSON body, a bad query parameter, an
// unknown route, a panic, a domain error from the store), goes through one function,
// writeProblem in problem.go, and one table from codes to statuses, statusOf beside it; a code
// without a status there is a test failure, not a 500 in production. Unknown errors become a
// bare 500 with no internals; the cause is logged with the request id so an operator can find
// it. A request whose client went away is not logged as an error.
//
// # Route table
//
// Routes outside the generated strict interface are listed in one place, the route table in
// server.go (the routes method), and are handed in through [Config]: the served spec, the exec
// websocket ([Config].ExecStream), the event stream, metrics and the dashboard. They are all
// still described in openapi.yaml, and validated against it like the others.
//
// # Browsers
//
// A server without a token listens on loopback only, which a web page in the user's browser
// can still reach. To keep such pages out, a tokenless server accepts only loopback Host
// headers (which defeats DNS rebinding), and every server refuses a request whose Origin
// header names another origin than the one it serves, unless that origin is allowed by
// configuration. These checks come before every route the listener serves, the foreign API
// (E2B's) included, and so do the body guard and the per-client bounds (clients.go): a route
// mounted outside them would be a way around them.
//
// # Clients
//
// A client is a remote IP. The listener holds at most so many connections per client and in
// all (LimitListener), and the long-lived requests (streams, tunnels, proxied requests) are
// counted per client too; past either bound the answer is 429 limit-reached, so that one
// client's flood leaves the server's descriptors, /healthz and other clients alone.
package server
