// Package web is bothyd's dashboard and its API reference. The dashboard is a small
// hand-written page (HTML, CSS and JavaScript under assets/) served at /, whose views (the
// sandboxes, one sandbox, templates, images, volumes, secrets, webhooks) are chosen in the
// browser by the URL's fragment (#/sandboxes/{id}), so it needs no route of its own; its
// plots are SVG it draws itself. The API reference at /docs is rendered in the browser by
// the vendored Redoc from the served /openapi.yaml.
// xterm.js and Redoc are vendored into assets/vendor/ by `npm run build`; everything is
// embedded in the binary and served by [Handler], /assets/ included. The dashboard talks to
// the API like any other client, with the token the operator enters once (kept in the
// browser's localStorage); it holds no state and has no route of its own beyond its files.
//
// # Security
//
// Every response carries a Content-Security-Policy that allows scripts only from the server
// itself (no inline scripts, no eval) and connections only to it, and forbids framing. The
// page renders API data with textContent, never as HTML: a sandbox's files, log, names and
// labels are written by whoever runs in it. Links made from API data are fragments of the page
// or port links checked to be of its own origin under /p/, never javascript: URLs. /docs has
// the same policy: Redoc needs no more than the dashboard ('unsafe-inline' styles, which both
// libraries generate); its search, which would run in a blob: worker, is switched off instead
// of widening worker-src, and its maker's logo from their CDN is blocked.
//
// # Vendored files
//
// assets/vendor/ is generated: `npm ci && npm run build` in this folder rebuilds it from
// package-lock.json, and CI fails if the committed copy differs.
package web
