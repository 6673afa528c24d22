package tests

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// TestDocs opens /docs in a real browser: the vendored Redoc renders the served spec's
// operations under the same Content-Security-Policy as the dashboard, and the policy reports
// no violation (a blocked script, style or worker would show here, not as an error).
func TestDocs(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, withToken("docs-token-0123456789abcdef"))

	// The page is open, like the spec it renders, and carries the dashboard's policy.
	r := d.do("GET", "/docs", nil, http.Header{"Authorization": {""}})
	csp := r.Header.Get("Content-Security-Policy")
	if r.Status != 200 || !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe-eval") {
		t.Fatalf("GET /docs: %d, Content-Security-Policy %q", r.Status, csp)
	}

	ctx := browser(t)
	// Record the policy's violations from the first script on, before the page's own run.
	record := `window.__violations = []; document.addEventListener("securitypolicyviolation",
		(e) => window.__violations.push(e.violatedDirective + " " + e.blockedURI));`
	run(ctx, t, "recording policy violations", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: record})
		return err
	}))
	run(ctx, t, "opening /docs", chromedp.Navigate(d.URL+"/docs"))
	until(ctx, t, "the reference rendered", `document.body.dataset.rendered === "true"`)
	// Operations of the served spec are there, by their summaries.
	for _, summary := range []string{"Create a sandbox", "Run a command with live input and output (websocket)", "Capture a sandbox as a new generation"} {
		until(ctx, t, "the operation "+summary, `Array.from(document.querySelectorAll("h2")).some((h) => h.textContent.includes(`+jsString(summary)+`))`)
	}
	violations, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__violations`))
	if err != nil {
		t.Fatal(err)
	}
	// Redoc's sidebar shows its maker's logo from their CDN; the policy blocks it as it
	// should (the page loads nothing from another origin), and that one block is expected.
	var unexpected []string
	for _, v := range violations {
		if !strings.HasPrefix(v, "img-src https://cdn.redoc.ly/") {
			unexpected = append(unexpected, v)
		}
	}
	if len(unexpected) > 0 {
		t.Fatalf("the policy was violated: %q", unexpected)
	}
	if shown, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!document.querySelector("#docs-error").hidden`)); err != nil || shown {
		t.Fatalf("the page shows an error (%v)", err)
	}
	saveScreenshot(ctx, t, "docs")
}

// jsString quotes s as a JavaScript string literal (s has no quote or backslash).
func jsString(s string) string { return `"` + s + `"` }
