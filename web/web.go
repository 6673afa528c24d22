package web

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed index.html docs.html assets
var files embed.FS

// contentSecurityPolicy confines the page to its own origin. Styles allow 'unsafe-inline'
// because xterm.js sizes its terminal with generated style elements; scripts do not.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; " +
	"form-action 'none'; frame-ancestors 'none'"

// Handler serves the dashboard (index.html at /), the API reference (docs.html at /docs,
// rendered in the browser by the vendored Redoc from /openapi.yaml) and the static files
// under /assets/. Both pages get the same policy: Redoc, like xterm.js, styles itself with
// generated style elements (styled-components), which 'unsafe-inline' in style-src already
// allows, and runs no inline script and no eval.
func Handler() http.Handler {
	assets, err := fs.Sub(files, ".")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	static := http.FileServerFS(assets)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		switch {
		case r.URL.Path == "/":
			// The page is small and changes with the binary: always revalidate.
			h.Set("Cache-Control", "no-cache")
			http.ServeFileFS(w, r, files, "index.html")
		case r.URL.Path == "/docs":
			h.Set("Cache-Control", "no-cache")
			http.ServeFileFS(w, r, files, "docs.html")
		case isFile(strings.TrimPrefix(r.URL.Path, "/")):
			h.Set("Cache-Control", "no-cache")
			static.ServeHTTP(w, r)
		default:
			// Answer like every other route: problem+json with a code.
			h.Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"type":"urn:bothyd:problem:not-found","title":"Not Found","status":404,` +
				`"detail":"The dashboard has no such file.","code":"not-found"}` + "\n"))
		}
	})
}

// isFile reports whether name is an embedded regular file under assets/ (directories are not
// listed).
func isFile(name string) bool {
	if !strings.HasPrefix(name, "assets/") || !fs.ValidPath(name) {
		return false
	}
	st, err := fs.Stat(files, name)
	return err == nil && st.Mode().IsRegular()
}
