// Package web is sandboxd's dashboard: a small hand-written page (HTML, CSS and JavaScript
// under assets/, with xterm.js vendored into assets/vendor/ by `npm run build`), embedded in
// the binary and served at / and /assets/ by [Handler]. It talks to the API like any other
// client, with the token the operator enters once (kept in the browser's localStorage); it
// holds no state and has no route of its own beyond its static files.
//
// # Security
//
// Every response carries a Content-Security-Policy that allows scripts only from the server
// itself (no inline scripts, no eval) and connections only to it, and forbids framing. The
// page renders API data with textContent, never as HTML.
//
// # Vendored files
//
// assets/vendor/ is generated: `npm ci && npm run build` in this folder rebuilds it from
// package-lock.json, and CI fails if the committed copy differs.
package web
