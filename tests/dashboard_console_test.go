package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// dashboardCSP is the dashboard's Content-Security-Policy (web.contentSecurityPolicy). The
// console's tests check that the pages work under it, unwidened.
const dashboardCSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; " +
	"form-action 'none'; frame-ancestors 'none'"

// readmeScreenshot is the sandbox page's screenshot that the README's dashboard section shows.
// TestDashboardSandboxPage rewrites it when BOTHY_UPDATE_SCREENSHOTS=1.
const readmeScreenshot = "../docs/dashboard-sandbox.png"

// consoleErrors collects what the page reports as broken: uncaught exceptions,
// console.error calls and the browser's own error log (a script, style or connection that the
// CSP refused is logged there, source "security"). Network answers the page handles itself
// (a 409 it explains, say) are logged by the browser too, under source "network": those are
// the API refusing, not the page failing, and are left out.
type consoleErrors struct {
	mu   sync.Mutex
	errs []string
	// network is the browser's network errors, kept to explain a failure the page shows.
	network []string
}

func (c *consoleErrors) listen(ev any) {
	var msg string
	switch e := ev.(type) {
	case *runtime.EventExceptionThrown:
		msg = "exception: " + e.ExceptionDetails.Text
		if e.ExceptionDetails.Exception != nil {
			msg += " " + e.ExceptionDetails.Exception.Description
		}
	case *runtime.EventConsoleAPICalled:
		if e.Type != runtime.ConsoleAPICalledTypeError && e.Type != runtime.ConsoleAPICalledTypeAssert {
			return
		}
		var parts []string
		for _, a := range e.Args {
			parts = append(parts, string(a.Value)+a.Description)
		}
		msg = "console." + string(e.Type) + ": " + strings.Join(parts, " ")
	case *cdplog.EventEntryAdded:
		if e.Entry.Level != cdplog.EntryLevelError {
			return
		}
		if e.Entry.Source == cdplog.EntrySourceNetwork {
			c.mu.Lock()
			c.network = append(c.network, time.Now().Format("15:04:05.000")+" "+e.Entry.Text+" "+e.Entry.URL)
			c.mu.Unlock()
			return
		}
		msg = "log (" + string(e.Entry.Source) + "): " + e.Entry.Text + " " + e.Entry.URL
	default:
		return
	}
	c.mu.Lock()
	c.errs = append(c.errs, msg)
	c.mu.Unlock()
}

func (c *consoleErrors) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		t.Fatalf("the page reported %d error(s):\n%s", len(c.errs), strings.Join(c.errs, "\n"))
	}
}

// networkLog is the browser's network errors, a line each.
func (c *consoleErrors) networkLog() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.network, "\n")
}

// consoleBrowser is a browser whose page's errors are collected, and whose downloads go to
// the directory it returns.
func consoleBrowser(t *testing.T) (context.Context, *consoleErrors, string) {
	t.Helper()
	errs := &consoleErrors{}
	ctx := browser(t, chromedp.WithListener(errs.listen))
	downloads := t.TempDir()
	run(ctx, t, "allowing downloads", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := cdp.Call(ctx, chromedp.FromContext(ctx).Browser, cdpbrowser.SetDownloadBehavior,
			cdpbrowser.SetDownloadBehaviorParams{Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads})
		return err
	}))
	return ctx, errs, downloads
}

// openConsole logs the browser in by the login URL, checks the page's policy, and waits for
// the live events.
func openConsole(ctx context.Context, t *testing.T, d *daemon) {
	t.Helper()
	r := d.do("GET", "/", nil, nil)
	if csp := r.Header.Get("Content-Security-Policy"); r.Status != 200 || csp != dashboardCSP {
		t.Fatalf("GET /: %d, Content-Security-Policy %q, want %q", r.Status, csp, dashboardCSP)
	}
	run(ctx, t, "opening the dashboard by its login URL", chromedp.Navigate(d.LoginURL()))
	until(ctx, t, "live events", `document.querySelector("#live").textContent === "live"`)
}

// goTo opens a page of the dashboard by its fragment, as a link does.
func goTo(ctx context.Context, t *testing.T, fragment, view string) {
	t.Helper()
	run(ctx, t, "opening "+fragment, chromedp.Evaluate[chromedp.Void](`location.hash = `+jsQuote(fragment)))
	until(ctx, t, "the "+view+" page", `!document.querySelector("#view-`+view+`").hidden`)
}

// jsQuote quotes s as a JavaScript string literal, whatever it holds.
func jsQuote(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// setValue sets an input's value as typing would, leaving the page's handlers to read it.
// It waits for the input to exist; a failure names it, with a screenshot (a bare assignment
// would fail at once with a TypeError).
func setValue(ctx context.Context, t *testing.T, sel, value string) {
	t.Helper()
	actOn(ctx, t, "filling "+sel, sel, `el.value = `+jsQuote(value))
}

// fillAndSubmit fills the input of a form in a list's row and submits the form, in one
// evaluation in the page: a live update redraws the row, and a value set in the old row
// would be lost to a click on the new one.
func fillAndSubmit(ctx context.Context, t *testing.T, what, form, value string) {
	t.Helper()
	actOn(ctx, t, what, form, `el.querySelector("input").value = `+jsQuote(value)+`; el.querySelector('button[type="submit"]').click()`)
}

// submit submits a form as its button does.
func submit(ctx context.Context, t *testing.T, form string) {
	t.Helper()
	clickLive(ctx, t, "submitting "+form, form+` button[type="submit"]`)
}

// clickExpr clicks the element that the JavaScript expression expr finds, once it does.
func clickExpr(ctx context.Context, t *testing.T, what, expr string) {
	t.Helper()
	until(ctx, t, what, `(() => { const el = `+expr+`; if (!el) return false; el.click(); return true })()`)
}

// confirmClick clicks a destructive button, sees it ask, and clicks it again.
func confirmClick(ctx context.Context, t *testing.T, what, sel string) {
	t.Helper()
	clickLive(ctx, t, what, sel)
	until(ctx, t, what+": asking again", `document.querySelector(`+jsQuote(sel)+`)?.textContent === "Sure?"`)
	clickLive(ctx, t, what+": confirming", sel)
}

// fieldError waits for a refusal shown beside the input sel, and answers its text.
func fieldError(ctx context.Context, t *testing.T, what, sel string) string {
	t.Helper()
	q := `document.querySelector(` + jsQuote(sel) + `)?.closest(".field")?.querySelector(".field-error")`
	until(ctx, t, what, q+` != null && document.querySelector(`+jsQuote(sel)+`).getAttribute("aria-invalid") === "true"`)
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](q+`.textContent`))
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// apiWait polls the API until cond holds of the answer to GET path.
func (d *daemon) apiWait(what, path string, cond func(r response) bool) response {
	d.t.Helper()
	var last response
	waitFor(d.t, 30*time.Second, what, func() bool {
		last = d.do("GET", path, nil, nil)
		return cond(last)
	})
	return last
}

func jsonField[T any](t testing.TB, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("decoding %s: %v", r.Body, err)
	}
	return v
}

type pageSandbox struct {
	State     string `json:"state"`
	ExpiresAt string `json:"expires_at"`
	OnTimeout string `json:"on_timeout"`
	Network   *struct {
		Internet bool     `json:"internet"`
		Allow    []string `json:"allow"`
	} `json:"network"`
}

// TestDashboardSandboxPage drives a sandbox's page in a real browser against a live bothyd:
// its facts and labels, the plots of its usage, its log, the file browser (list, download,
// upload, delete) with a hostile file name shown as text, the terminal, port links (one made
// through the API listed without its URL and revoked from the page; one made on the page,
// copied, followed and revoked; each revocation checked in the API's list), its network policy (changed, and a refusal shown beside its field), its
// lifetime, checkpoints (taken, rolled back to, deleted), a fork, a capture, pause, resume,
// stop, start and a forced delete; each effect is checked through the API, and the page
// reports no error. Screenshots go to artefactsDir; with BOTHY_UPDATE_SCREENSHOTS=1 the
// README's is rewritten too.
func TestDashboardSandboxPage(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	const id = "page-sb"
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{
		"id": id, "start": true, "labels": map[string]string{"team": "web", "job": "42"}, "resources": map[string]any{"disk_mb": 0},
	}), 201)
	t.Cleanup(func() {
		d.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil)
	})
	put := func(path, body string) {
		t.Helper()
		h := http.Header{"Content-Type": {"application/octet-stream"}}
		if r := d.do("PUT", "/v1/sandboxes/"+id+"/files?path="+urlQuery(path), strings.NewReader(body), h); r.Status != 204 {
			t.Fatalf("writing %s: %d %s", path, r.Status, r.Body)
		}
	}
	const hostile = `<img src=x onerror="document.title='pwned'">.txt`
	put("/tmp/hello.txt", "hello from the sandbox\n")
	put("/tmp/"+hostile, "markup in a name\n")
	// A link made through the API, before the page opens: the page lists it without its URL.
	apiLink := decode[linkJSON](t, d.doJSON("POST", "/v1/sandboxes/"+id+"/ports/8081/links", map[string]any{"ttl_s": 600}), 201)
	ctx, errs, downloads := consoleBrowser(t)
	openConsole(ctx, t, d)
	clickLive(ctx, t, "opening the sandbox from the list", `tr[data-id="`+id+`"] a[data-sandbox-link]`)
	until(ctx, t, "the sandbox's page", `!document.querySelector("#view-sandbox").hidden && location.hash === "#/sandboxes/`+id+`"`)
	until(ctx, t, "its state", `document.querySelector("#sb-state").dataset.state === "running"`)
	until(ctx, t, "its labels and facts", `document.querySelector("#sb-labels").textContent.includes("team=web") && document.querySelector('[data-fact="resources"]').textContent.includes("vCPU")`)

	// The plots: the server's samples and the current reading, drawn.
	for _, m := range []string{"memory", "pids"} {
		until(ctx, t, "the "+m+" plot with two samples",
			`(() => { const f = document.querySelector('#sb-charts [data-metric="`+m+`"]'); return f && Number(f.dataset.points) >= 2 && f.querySelector("polyline") !== null })()`)
	}
	until(ctx, t, "the cpu plot", `document.querySelector('#sb-charts [data-metric="cpu"]') !== null`)

	// The log: the agent's and the runtime's lines, as the API answers them. (A sandbox's
	// processes cannot write into it; its text is set as text all the same.)
	logText := string(d.do("GET", "/v1/sandboxes/"+id+"/logs", nil, nil).Body)
	if !strings.Contains(logText, "agent listening") {
		t.Fatalf("the log through the API: %q", logText)
	}
	until(ctx, t, "the log", `document.querySelector("#sb-log").textContent.includes("agent listening") && document.querySelector("#sb-log").children.length === 0`)

	// Files: list /tmp; the hostile name is a name, not an element.
	setValue(ctx, t, "#files-path", "/tmp")
	submit(ctx, t, "#files-form")
	until(ctx, t, "the files of /tmp", `document.querySelector('#files tr[data-file="hello.txt"]') !== null`)
	until(ctx, t, "the hostile name as text", `[...document.querySelectorAll("#files tr[data-file]")].some(r => r.dataset.file === `+jsQuote(hostile)+` && r.cells[0].textContent === `+jsQuote(hostile)+`)`)
	until(ctx, t, "no element from the name", `document.querySelector("#files img") === null && document.title !== "pwned"`)

	// Up to / and down again by the directory's name.
	clickLive(ctx, t, "going up", "#files-up")
	until(ctx, t, "the root listed", `document.querySelector("#files-path").value === "/" && document.querySelector('#files tr[data-file="tmp"][data-type="directory"]') !== null`)
	clickLive(ctx, t, "opening tmp", `#files tr[data-file="tmp"] button[data-open]`)
	until(ctx, t, "/tmp again", `document.querySelector("#files-path").value === "/tmp" && document.querySelector('#files tr[data-file="hello.txt"]') !== null`)
	clickLive(ctx, t, "downloading hello.txt", `#files tr[data-file="hello.txt"] button[data-action="download"]`)
	waitFor(t, 30*time.Second, "the downloaded file", func() bool {
		b, err := os.ReadFile(filepath.Join(downloads, "hello.txt"))
		return err == nil && string(b) == "hello from the sandbox\n"
	})

	upload := filepath.Join(t.TempDir(), "uploaded.txt")
	if err := os.WriteFile(upload, []byte("up from the browser\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(ctx, t, "choosing a file", chromedp.SetUploadFiles(chromedp.CSS("#upload-file"), []string{upload}))
	submit(ctx, t, "#upload-form")
	until(ctx, t, "the uploaded file listed", `document.querySelector('#files tr[data-file="uploaded.txt"]') !== null`)
	if r := d.do("GET", "/v1/sandboxes/"+id+"/files?path=/tmp/uploaded.txt", nil, nil); r.Status != 200 || string(r.Body) != "up from the browser\n" {
		t.Fatalf("the uploaded file through the API: %d %q", r.Status, r.Body)
	}
	hostileDelete := `[...document.querySelectorAll("#files tr[data-file]")].find(r => r.dataset.file === ` + jsQuote(hostile) + `)?.querySelector('button[data-action="delete-file"]')`
	clickExpr(ctx, t, "deleting the hostile file", hostileDelete)
	until(ctx, t, "deleting the hostile file: asking again", hostileDelete+`?.textContent === "Sure?"`)
	clickExpr(ctx, t, "confirming", hostileDelete)
	until(ctx, t, "the file gone from the list", `![...document.querySelectorAll("#files tr[data-file]")].some(r => r.dataset.file === `+jsQuote(hostile)+`)`)
	wantProblem(t, d.do("GET", "/v1/sandboxes/"+id+"/files?path="+urlQuery("/tmp/"+hostile), nil, nil), 404, "file-not-found")

	// The terminal on the page.
	clickLive(ctx, t, "opening the terminal", "#terminal-open")
	until(ctx, t, "the terminal to connect", `document.querySelector("#terminal-status").textContent === "connected"`)
	until(ctx, t, "the shell's prompt", `[...document.querySelectorAll("#terminal .xterm-rows > div")].some(r => r.textContent.trim().endsWith("$"))`)
	run(ctx, t, "typing into the terminal", chromedp.Click(chromedp.CSS("#terminal .xterm-screen")), typeKeys("echo page-$((6*7))\r"))
	until(ctx, t, "the output", `[...document.querySelectorAll("#terminal .xterm-rows > div")].some(r => r.textContent.trim() === "page-42")`)

	// The link made through the API is listed, by id, without its URL or token.
	apiRow := `#links tr[data-link="` + apiLink.ID + `"]`
	until(ctx, t, "the API's link listed", `(() => { const r = document.querySelector('`+apiRow+`'); return r !== null && r.dataset.madeHere === "false" && r.dataset.port === "8081" && r.querySelector("a") === null && r.textContent.includes("made elsewhere") })()`)
	if leaked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.body.innerHTML.includes(`+jsQuote(apiLink.Token[33:])+`)`)); err != nil || leaked {
		t.Fatalf("the page shows the listed link's token (%v)", err)
	}

	// A link to a port: made, shown as a link of this server, followed without the token,
	// revoked.
	setValue(ctx, t, "#link-port", "8080")
	setValue(ctx, t, "#link-ttl", "600")
	submit(ctx, t, "#link-form")
	until(ctx, t, "the link", `document.querySelector('#links tr[data-made-here="true"] a') !== null`)
	href, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#links tr[data-made-here="true"] a').href`))
	if err != nil || !strings.HasPrefix(href, d.URL+"/p/") {
		t.Fatalf("the link's href %q (%v), want one under %s/p/", href, err, d.URL)
	}
	madeID, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#links tr[data-made-here="true"]').dataset.link`))
	if err != nil {
		t.Fatal(err)
	}
	madeRow := `#links tr[data-link="` + madeID + `"]`
	// Copy puts the link on the clipboard (which the browser lets this origin write).
	run(ctx, t, "letting the page use the clipboard", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		return chromedp.FromContext(ctx).Browser.Call(ctx, "Browser.grantPermissions", map[string]any{
			"origin": d.URL, "permissions": []string{"clipboardReadWrite", "clipboardSanitizedWrite"},
		}, nil)
	}))
	clickLive(ctx, t, "copying the link", madeRow+` button[data-action="copy-link"]`)
	until(ctx, t, "the link copied", `document.querySelector('`+madeRow+`').textContent.includes("copied")`)
	copied, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise))
	if err != nil || copied != href {
		t.Fatalf("the clipboard holds %q (%v), want the link %q", copied, err, href)
	}
	linkPath := strings.TrimPrefix(href, d.URL)
	noToken := http.Header{"Authorization": {""}}
	if r := d.do("GET", linkPath, nil, noToken); r.Status == 404 || r.Status == 401 {
		t.Fatalf("the link without the token: %d %s", r.Status, r.Body)
	}
	// listed is the ids the API lists for the sandbox.
	listed := func() string {
		t.Helper()
		var list struct {
			Items []linkInfoJSON `json:"items"`
		}
		if r := d.do("GET", "/v1/sandboxes/"+id+"/links", nil, nil); r.Status != 200 || json.Unmarshal(r.Body, &list) != nil {
			t.Fatalf("listing the links: %d %s", r.Status, r.Body)
		}
		var ids []string
		for _, l := range list.Items {
			ids = append(ids, l.ID)
		}
		return strings.Join(ids, ",")
	}
	if got := listed(); got != apiLink.ID+","+madeID && got != madeID+","+apiLink.ID {
		t.Fatalf("the API lists %s, want %s and %s", got, apiLink.ID, madeID)
	}
	confirmClick(ctx, t, "revoking the link", madeRow+` button[data-action="revoke-link"]`)
	until(ctx, t, "the link gone from the list", `document.querySelector('`+madeRow+`') === null && document.querySelector('`+apiRow+`') !== null`)
	wantProblem(t, d.do("GET", linkPath, nil, noToken), 404, "link-not-found")
	if got := listed(); got != apiLink.ID {
		t.Fatalf("after the revocation the API lists %s, want %s alone", got, apiLink.ID)
	}
	// The listed link, made elsewhere, is revoked from the page too.
	confirmClick(ctx, t, "revoking the API's link", apiRow+` button[data-action="revoke-link"]`)
	until(ctx, t, "no live link", `document.querySelector('`+apiRow+`') === null && document.querySelector("#links tr.empty") !== null`)
	if got := listed(); got != "" {
		t.Fatalf("after both revocations the API lists %s", got)
	}
	wantProblem(t, d.do("GET", apiLink.Path, nil, noToken), 404, "link-not-found")
	wantProblem(t, d.do("DELETE", "/v1/sandboxes/"+id+"/ports/8081/links/"+apiLink.ID, nil, nil), 404, "link-not-found")

	// A fork (before the sandbox has a network policy: see the report of issue 44).
	setValue(ctx, t, "#sb-fork-count", "1")
	submit(ctx, t, "#sb-fork-form")
	until(ctx, t, "the fork linked", `document.querySelector("#sb-fork-result a[data-sandbox-link]") !== null`)
	fork, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#sb-fork-result a[data-sandbox-link]").dataset.sandboxLink`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+fork+"?force=true", nil) })
	if r := d.do("GET", "/v1/sandboxes/"+fork, nil, nil); r.Status != 200 {
		t.Fatalf("the fork %q through the API: %d %s", fork, r.Status, r.Body)
	}

	// An answer whose path is not a link of this server (a javascript: URL, another origin)
	// never becomes a link: the page's fetch is wrapped to answer them, as a hostile or broken
	// server would.
	for _, path := range []string{"javascript:document.title='pwned'//", "//evil.example/p/x/", "https://evil.example/p/x/"} {
		// The wrapped server answers the create with the hostile path, and lists the link
		// it made so (a hostile server would), so the page's own listings keep it.
		run(ctx, t, "wrapping fetch", chromedp.Evaluate[chromedp.Void](`(() => {
			const real = window.fetch;
			window.realFetch = real;
			window.hostileLink = null;
			window.fetch = async (p, init) => {
				const r = await real(p, init);
				if (!String(p).endsWith("/links")) return r;
				if (init.method === "POST") {
					const l = await r.json();
					l.path = `+jsQuote(path)+`;
					l.id = "hostile" + l.id;
					window.hostileLink = l;
					return new Response(JSON.stringify(l), { status: 201, headers: { "Content-Type": "application/json" } });
				}
				const list = await r.json();
				const h = window.hostileLink;
				if (h) list.items.push({ id: h.id, sandbox: h.sandbox, port: h.port, created_at: h.created_at, expires_at: h.expires_at });
				return new Response(JSON.stringify(list), { status: 200, headers: { "Content-Type": "application/json" } });
			};
		})()`))
		submit(ctx, t, "#link-form")
		until(ctx, t, "the hostile link "+path+" shown as no link", `(() => { const h = window.hostileLink; const r = h && document.querySelector('#links tr[data-link="' + h.id + '"]'); return !!r && r.querySelector("a") === null && r.textContent.includes("not a link of this server") })()`)
		until(ctx, t, "no javascript: or foreign link", `![...document.querySelectorAll("a")].some(a => a.protocol === "javascript:" || a.host === "evil.example") && document.title !== "pwned"`)
		run(ctx, t, "unwrapping fetch", chromedp.Evaluate[chromedp.Void](`window.fetch = window.realFetch`))
	}

	// The network policy: a refusal beside its field, then a change.
	setValue(ctx, t, "#net-allow", "example.com\n127.0.0.1")
	submit(ctx, t, "#network-form")
	if msg := fieldError(ctx, t, "the refused entry beside the allow list", "#net-allow"); !strings.Contains(msg, "invalid-request") {
		t.Fatalf("the refusal beside the field: %q", msg)
	}
	setValue(ctx, t, "#net-allow", "example.com")
	submit(ctx, t, "#network-form")
	until(ctx, t, "the refusal cleared", `document.querySelector("#network-form .field-error") === null`)
	d.apiWait("the policy changed", "/v1/sandboxes/"+id, func(r response) bool {
		sb := jsonField[pageSandbox](t, r)
		return sb.Network != nil && len(sb.Network.Allow) == 1 && sb.Network.Allow[0] == "example.com"
	})

	// The lifetime.
	setValue(ctx, t, "#sb-extend-seconds", "900")
	submit(ctx, t, "#sb-extend-form")
	until(ctx, t, "the lifetime shown", `document.querySelector('[data-fact="lifetime"]').textContent.startsWith("ends in")`)
	sb := jsonField[pageSandbox](t, d.do("GET", "/v1/sandboxes/"+id, nil, nil))
	if left := time.Until(mustTime(t, sb.ExpiresAt)); left < 800*time.Second || left > 901*time.Second {
		t.Fatalf("expires_at %s is %v away, want about 900 s", sb.ExpiresAt, left)
	}

	// A checkpoint, then the page as it looks for the README.
	setValue(ctx, t, "#sb-checkpoint-name", "before")
	submit(ctx, t, "#sb-checkpoint-form")
	until(ctx, t, "the checkpoint listed", `document.querySelector('#checkpoints tr[data-checkpoint="before"]') !== null`)
	if r := d.do("GET", "/v1/sandboxes/"+id+"/checkpoints/before", nil, nil); r.Status != 200 {
		t.Fatalf("the checkpoint through the API: %d %s", r.Status, r.Body)
	}
	run(ctx, t, "scrolling to the top", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	saveScreenshot(ctx, t, "sandbox")
	if os.Getenv("BOTHY_UPDATE_SCREENSHOTS") == "1" {
		shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(readmeScreenshot, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %s", readmeScreenshot)
	}

	// Rolling back throws away what was written since.
	put("/tmp/after.txt", "written after the checkpoint\n")
	confirmClick(ctx, t, "rolling back", `#checkpoints tr[data-checkpoint="before"] button[data-action="rollback"]`)
	d.apiWait("the rollback", "/v1/sandboxes/"+id+"/files?path=/tmp/after.txt", func(r response) bool { return r.Status == 404 })
	until(ctx, t, "running again", `document.querySelector("#sb-state").dataset.state === "running"`)

	// A capture into a template.
	if r := d.doJSON("POST", "/v1/templates", map[string]any{"name": "page-tpl"}); r.Status != 201 {
		t.Fatalf("template: %d %s", r.Status, r.Body)
	}
	setValue(ctx, t, "#sb-capture-template", "page-tpl")
	submit(ctx, t, "#sb-capture-form")
	until(ctx, t, "the capture reported", `document.querySelector("#sb-capture-status").textContent.startsWith("captured as page-tpl @ ")`)
	d.apiWait("the generation", "/v1/templates/page-tpl/generations", func(r response) bool {
		return r.Status == 200 && strings.Count(string(r.Body), `"id"`) == 1
	})

	confirmClick(ctx, t, "deleting the checkpoint", `#checkpoints tr[data-checkpoint="before"] button[data-action="delete-checkpoint"]`)
	until(ctx, t, "the checkpoint gone", `document.querySelector('#checkpoints tr[data-checkpoint="before"]') === null`)
	wantProblem(t, d.do("GET", "/v1/sandboxes/"+id+"/checkpoints/before", nil, nil), 404, "checkpoint-not-found")

	// The lifecycle buttons that apply to each state.
	for _, step := range []struct{ action, state string }{
		{"pause", "paused"}, {"resume", "running"}, {"stop", "stopped"}, {"start", "running"},
	} {
		clickLive(ctx, t, step.action, `#sb-actions button[data-action="`+step.action+`"]`)
		until(ctx, t, "the page "+step.state, `document.querySelector("#sb-state").dataset.state === "`+step.state+`"`)
		if got := jsonField[pageSandbox](t, d.do("GET", "/v1/sandboxes/"+id, nil, nil)).State; got != step.state {
			t.Fatalf("after %s the API says %s, want %s", step.action, got, step.state)
		}
	}
	saveScreenshot(ctx, t, "sandbox-end")

	// A forced delete, confirmed, goes back to the list.
	confirmClick(ctx, t, "deleting the sandbox", `#sb-actions button[data-action="delete"]`)
	until(ctx, t, "back on the list", `!document.querySelector("#view-sandboxes").hidden && document.querySelector('tr[data-id="`+id+`"]') === null`)
	wantProblem(t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 404, "sandbox-not-found")
	if msg, err := chromedp.Run(ctx, pageError()); err != nil || msg != "" {
		t.Fatalf("the page shows an error at the end: %q (%v); the browser's network errors:\n%s", msg, err, errs.networkLog())
	}
	errs.check(t)
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return at
}

func urlQuery(s string) string {
	r := strings.NewReplacer("%", "%25", "&", "%26", "+", "%2B", " ", "%20", "#", "%23", "=", "%3D", "?", "%3F", "'", "%27", `"`, "%22", "<", "%3C", ">", "%3E")
	return r.Replace(s)
}

// gatedRegistry serves an in-memory registry on loopback whose large blobs send their first
// half, then wait until open is closed: a pull held in the middle of a layer, so that its
// progress can be seen.
func gatedRegistry(t testing.TB, open <-chan struct{}) *httptest.Server {
	t.Helper()
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/sha256:") {
			inner.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		if rec.Code != http.StatusOK || len(body) < 1<<20 {
			_, _ = w.Write(body)
			return
		}
		_, _ = w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		select {
		case <-open:
			_, _ = w.Write(body[len(body)/2:])
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestDashboardResources drives the pages of the other resources against a live bothyd: an
// image pulled with its progress shown, one imported, its users named, one deleted; a volume
// created (and a refusal shown beside its field) and deleted; a secret created, rotated and
// deleted without its value ever in the page; a webhook created, its deliveries shown, and
// deleted; and a refusal of the create form beside its field. Each effect is checked through
// the API; the page reports no error; each page's screenshot goes to artefactsDir.
func TestDashboardResources(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--webhook-allow-private"))
	ctx, errs, _ := consoleBrowser(t)
	openConsole(ctx, t, d)

	// The create form: a refusal is shown beside the field it names.
	setValue(ctx, t, "#create-vcpus", "9999")
	submit(ctx, t, "#create-form")
	if msg := fieldError(ctx, t, "the vCPUs refused beside their field", "#create-vcpus"); !strings.Contains(msg, "invalid-request") {
		t.Fatalf("the refusal beside the field: %q", msg)
	}
	until(ctx, t, "the server's limits shown", `document.querySelector('[data-hint="vcpus"]').textContent.startsWith("default ")`)
	saveScreenshot(ctx, t, "sandboxes")
	setValue(ctx, t, "#create-vcpus", "")

	t.Run("images", func(t *testing.T) {
		d := d.in(t)
		gate := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(gate) }) }
		srv := gatedRegistry(t, gate)
		t.Cleanup(release) // before the registry's Close, which waits for its held answers
		img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}}, 4<<20)
		ref := serveRegistryAt(t, srv, img, "tools/bb:1")

		goTo(ctx, t, "#/images", "images")
		setValue(ctx, t, "#pull-ref", ref)
		setValue(ctx, t, "#pull-name", "bb")
		submit(ctx, t, "#pull-form")
		until(ctx, t, "the pull's progress", `(() => { const r = document.querySelector('#images tr[data-image="bb"]'); const p = r && r.querySelector("progress"); return r && r.dataset.state === "pulling" && p && p.value > 0 && p.value < p.max })()`)
		saveScreenshot(ctx, t, "images-pulling")
		release()
		until(ctx, t, "the image ready", `document.querySelector('#images tr[data-image="bb"]')?.dataset.state === "ready"`)
		d.waitImage("bb")

		archive := filepath.Join(t.TempDir(), "bb.tar")
		if err := os.WriteFile(archive, dockerSave(t, busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}}, 0)), 0o600); err != nil {
			t.Fatal(err)
		}
		setValue(ctx, t, "#import-name", "bb-imported")
		run(ctx, t, "choosing the archive", chromedp.SetUploadFiles(chromedp.CSS("#import-file"), []string{archive}))
		submit(ctx, t, "#import-form")
		until(ctx, t, "the imported image", `document.querySelector('#images tr[data-image="bb-imported"]')?.dataset.state === "ready"`)
		if r := d.do("GET", "/v1/images/bb-imported", nil, nil); r.Status != 200 {
			t.Fatalf("the imported image through the API: %d %s", r.Status, r.Body)
		}

		d.createOn("on-bb", "bb")
		until(ctx, t, "its user named", `document.querySelector('#images tr[data-image="bb"] a[data-sandbox-link="on-bb"]') !== null`)
		saveScreenshot(ctx, t, "images")
		confirmClick(ctx, t, "deleting the imported image", `#images tr[data-image="bb-imported"] button[data-action="delete-image"]`)
		until(ctx, t, "the image gone", `document.querySelector('#images tr[data-image="bb-imported"]') === null`)
		wantProblem(t, d.do("GET", "/v1/images/bb-imported", nil, nil), 404, "image-not-found")
	})

	t.Run("volumes", func(t *testing.T) {
		d := d.in(t)
		if why := disksUnsupported(); why != "" {
			t.Skipf("volumes need loop devices and mke2fs: %s", why)
		}
		goTo(ctx, t, "#/volumes", "volumes")
		setValue(ctx, t, "#volume-name", "Not_A_Name")
		submit(ctx, t, "#volume-form")
		fieldError(ctx, t, "the name refused beside its field", "#volume-name")
		setValue(ctx, t, "#volume-name", "data-a")
		setValue(ctx, t, "#volume-size", "32")
		submit(ctx, t, "#volume-form")
		until(ctx, t, "the volume listed", `document.querySelector('#volumes tr[data-volume="data-a"]') !== null && document.querySelector("#volume-form .field-error") === null`)
		vol := jsonField[struct {
			SizeMB int `json:"size_mb"`
		}](t, d.do("GET", "/v1/volumes/data-a", nil, nil))
		if vol.SizeMB != 32 {
			t.Fatalf("the volume's size through the API: %d MiB, want 32", vol.SizeMB)
		}
		// A sandbox that mounts it: named on the volume's row, and the volume on its page.
		decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{
			"id": "vol-user", "volumes": []map[string]any{{"name": "data-a", "path": "/data", "read_only": true}},
		}), 201)
		until(ctx, t, "the volume's user named", `document.querySelector('#volumes tr[data-volume="data-a"] a[data-sandbox-link="vol-user"]') !== null`)
		saveScreenshot(ctx, t, "volumes")
		clickLive(ctx, t, "opening its user", `#volumes tr[data-volume="data-a"] a[data-sandbox-link="vol-user"]`)
		until(ctx, t, "the volume on the sandbox's page", `document.querySelector('#sb-volumes li[data-volume="data-a"]')?.textContent === "data-a at /data (read-only)"`)
		if r := d.doJSON("DELETE", "/v1/sandboxes/vol-user", nil); r.Status != 204 {
			t.Fatalf("deleting vol-user: %d %s", r.Status, r.Body)
		}
		goTo(ctx, t, "#/volumes", "volumes")
		until(ctx, t, "the volume free", `document.querySelector('#volumes tr[data-volume="data-a"] a[data-sandbox-link]') === null`)
		confirmClick(ctx, t, "deleting the volume", `#volumes tr[data-volume="data-a"] button[data-action="delete-volume"]`)
		until(ctx, t, "the volume gone", `document.querySelector('#volumes tr[data-volume="data-a"]') === null`)
		wantProblem(t, d.do("GET", "/v1/volumes/data-a", nil, nil), 404, "volume-not-found")
	})

	t.Run("secrets", func(t *testing.T) {
		d := d.in(t)
		const value, rotated = "first-value-never-shown-0xA1", "second-value-never-shown-0xB2"
		noValue := func(when string) {
			t.Helper()
			html, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML + [...document.querySelectorAll("input")].map(i => i.value).join(" ")`))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(html, value) || strings.Contains(html, rotated) {
				t.Fatalf("%s: a secret's value is in the page", when)
			}
		}
		goTo(ctx, t, "#/secrets", "secrets")
		setValue(ctx, t, "#secret-name", "API_KEY")
		setValue(ctx, t, "#secret-value", value)
		submit(ctx, t, "#secret-form")
		until(ctx, t, "the secret listed", `document.querySelector('#secrets tr[data-secret="API_KEY"]') !== null`)
		noValue("after the create")
		if r := d.do("GET", "/v1/secrets/API_KEY", nil, nil); r.Status != 200 || bytes.Contains(r.Body, []byte(value)) {
			t.Fatalf("the secret through the API: %d %s", r.Status, r.Body)
		}
		fillAndSubmit(ctx, t, "rotating it", `#secrets form[data-rotate="API_KEY"]`, rotated)
		d.apiWait("the rotation", "/v1/secrets/API_KEY", func(r response) bool { return bytes.Contains(r.Body, []byte(`"rotated_at"`)) })
		until(ctx, t, "the rotation shown", `document.querySelector('#secrets tr[data-secret="API_KEY"]').cells[2].textContent !== "never"`)
		noValue("after the rotation")
		saveScreenshot(ctx, t, "secrets")
		confirmClick(ctx, t, "deleting the secret", `#secrets tr[data-secret="API_KEY"] button[data-action="delete-secret"]`)
		until(ctx, t, "the secret gone", `document.querySelector('#secrets tr[data-secret="API_KEY"]') === null`)
		wantProblem(t, d.do("GET", "/v1/secrets/API_KEY", nil, nil), 404, "secret-not-found")
	})

	t.Run("webhooks", func(t *testing.T) {
		d := d.in(t)
		var got sync.WaitGroup
		got.Add(1)
		var first sync.Once
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			first.Do(got.Done)
			w.WriteHeader(http.StatusNoContent)
		}))
		t.Cleanup(receiver.Close)

		goTo(ctx, t, "#/webhooks", "webhooks")
		setValue(ctx, t, "#webhook-url", receiver.URL+"/hook")
		setValue(ctx, t, "#webhook-secret", "a-signing-secret-of-some-length")
		submit(ctx, t, "#webhook-form")
		until(ctx, t, "the webhook listed", `document.querySelector("#webhooks tr[data-webhook]") !== null`)
		hookID, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#webhooks tr[data-webhook]").dataset.webhook`))
		if err != nil {
			t.Fatal(err)
		}
		if r := d.do("GET", "/v1/webhooks/"+hookID, nil, nil); r.Status != 200 || !strings.Contains(string(r.Body), receiver.URL) {
			t.Fatalf("the webhook through the API: %d %s", r.Status, r.Body)
		}
		d.create("hooked", false)
		got.Wait()
		until(ctx, t, "the delivery shown", `document.querySelector('#webhooks tr[data-webhook] td.delivery').textContent.includes("1 delivered")`)
		saveScreenshot(ctx, t, "webhooks")
		confirmClick(ctx, t, "deleting the webhook", `#webhooks tr[data-webhook] button[data-action="delete-webhook"]`)
		until(ctx, t, "the webhook gone", `document.querySelector("#webhooks tr[data-webhook]") === null`)
		wantProblem(t, d.do("GET", "/v1/webhooks/"+hookID, nil, nil), 404, "webhook-not-found")
	})

	goTo(ctx, t, "#/templates", "templates")
	saveScreenshot(ctx, t, "templates")
	if msg, err := chromedp.Run(ctx, pageError()); err != nil || msg != "" {
		t.Fatalf("the page shows an error at the end: %q (%v); the browser's network errors:\n%s", msg, err, errs.networkLog())
	}
	errs.check(t)
}

// serveRegistryAt pushes img to the registry srv as repo (repository:tag) and returns the
// reference.
func serveRegistryAt(t testing.TB, srv *httptest.Server, img v1.Image, repo string) string {
	t.Helper()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/" + repo
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}
