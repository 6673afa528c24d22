package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// chromiumPath is Debian's chromium, which scripts/setup installs.
const chromiumPath = "/usr/bin/chromium"

// browser starts a headless Chromium with a fresh profile and returns a tab's context; the
// browser ends with the test. opts are the tab's (a listener for its console, say).
func browser(t *testing.T, opts ...chromedp.ContextOption) context.Context {
	t.Helper()
	path, err := exec.LookPath(chromiumPath)
	if err != nil {
		t.Skipf("the dashboard tests need Chromium at %s (scripts/setup installs it): %v", chromiumPath, err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // root cannot use Chromium's sandbox; the page is our own
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	ctx, cancelTab := chromedp.NewContext(alloc, opts...)
	// A bound on a browser stuck for good; the console's tests drive many pages in one.
	ctx, cancelTimeout := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelTab(); cancelAlloc() })
	return ctx
}

// until waits for a JavaScript condition in the page.
func until(ctx context.Context, t *testing.T, what, expr string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		msg, _ := chromedp.Run(ctx, pageError())
		saveScreenshot(ctx, t, "failed")
		t.Fatalf("waiting for %s: %v (the page shows the error %q)", what, err, msg)
	}
}

// clickLive clicks the element sel as soon as it exists, in one evaluation in the page: rows
// are re-rendered by live updates, so a node found by one call can be gone by the next (a
// chromedp.Click finds, then clicks).
func clickLive(ctx context.Context, t *testing.T, what, sel string) {
	t.Helper()
	actOn(ctx, t, what, sel, "el.click()")
}

// actOn waits for the element sel and runs the JavaScript statements act on it (as el), in
// the one evaluation that finds it.
func actOn(ctx context.Context, t *testing.T, what, sel, act string) {
	t.Helper()
	until(ctx, t, what, `(() => { const el = document.querySelector(`+jsQuote(sel)+`); if (!el) return false; `+act+`; return true })()`)
}

// artefactsDir is where the dashboard tests keep their screenshots, for a person (or CI's
// artefact upload) to look at: $BOTHY_ARTEFACTS when set, else tests/artifacts/ (ignored by
// git).
func artefactsDir() string {
	if dir := os.Getenv("BOTHY_ARTEFACTS"); dir != "" {
		return dir
	}
	return "artifacts"
}

// saveScreenshot saves the whole page as <artefacts>/<test>-<suffix>.png.
func saveScreenshot(ctx context.Context, t *testing.T, suffix string) {
	t.Helper()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	if err := os.MkdirAll(artefactsDir(), 0o750); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(artefactsDir(), strings.ReplaceAll(t.Name(), "/", "-")+"-"+suffix+".png")
	if err := os.WriteFile(name, shot, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", name)
}

// typeKeys types into the focused element as a keyboard does: one keyDown carrying the text,
// then keyUp. chromedp's KeyEvent adds a separate char event, which an editor that takes
// printable keys on keydown (xterm.js does) would type a second time.
func typeKeys(keys string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, r := range keys {
			var down, up *input.DispatchKeyEventParams
			text := ""
			for _, k := range kb.Encode(r) {
				switch k.Type {
				case kb.KeyDown:
					down = k
				case kb.KeyChar:
					text = k.Text
				case kb.KeyUp:
					up = k
				}
			}
			if down == nil || up == nil {
				return fmt.Errorf("no key for %q", r)
			}
			down.Text, down.UnmodifiedText = text, text
			for _, k := range []*input.DispatchKeyEventParams{down, up} {
				if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, *k); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// pageError is the error banner's text, or "" while it is hidden.
func pageError() chromedp.Action[string] {
	return chromedp.Evaluate[string](`document.querySelector("#error").hidden ? "" : document.querySelector("#error-text").textContent`)
}

// run runs browser actions, failing the test on an error.
func run(ctx context.Context, t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestDashboard drives the dashboard in a real browser: create a sandbox, start it, open its
// terminal (on the sandbox's page) and run a command, see a refusal explained, stop and delete
// it; with and without a token. A screenshot of each run is saved (artefactsDir).
func TestDashboard(t *testing.T) {
	requireRoot(t)
	cases := []struct{ name, token string }{
		{"no-token", ""},
		{"token", "dashboard-token-0123456789abcdef"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := []daemonOption{withoutAuth()}
			if tc.token != "" {
				opts = []daemonOption{withToken(tc.token)}
			}
			d := startDaemon(t, opts...)
			ctx := browser(t)
			id := "dash-" + tc.name
			row := `document.querySelector('tr[data-id="` + id + `"]')`

			run(ctx, t, "opening the dashboard", chromedp.Navigate(d.URL+"/"))
			if tc.token != "" {
				// The first API call is refused, and the page asks for the token.
				until(ctx, t, "the token form", `!document.querySelector("#token-panel").hidden`)
				run(ctx, t, "entering the token",
					chromedp.SendKeys(chromedp.CSS("#token-input"), tc.token),
					chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)))
			}
			until(ctx, t, "live events", `document.querySelector("#live").textContent === "live"`)
			if tc.token != "" {
				// The token was entered once: a reload finds it in the browser.
				run(ctx, t, "reloading", chromedp.Navigate(d.URL+"/"))
				until(ctx, t, "live events after the reload", `document.querySelector("#live").textContent === "live" && document.querySelector("#token-panel").hidden`)
			}

			// Create without starting (with a disk of its own where the host can give one),
			// then start from the row.
			create := []chromedp.Action[chromedp.Void]{
				chromedp.SendKeys(chromedp.CSS("#create-id"), id),
				chromedp.SendKeys(chromedp.CSS("#create-labels"), "team=web"),
				chromedp.Click(chromedp.CSS("#create-start")),
			}
			withDisk := disksUnsupported() == ""
			if withDisk {
				create = append(create, chromedp.SendKeys(chromedp.CSS("#create-disk"), "64"))
			}
			run(ctx, t, "creating a sandbox", append(create, chromedp.Click(chromedp.CSS("#create-submit")))...)
			until(ctx, t, "the provisioned sandbox", row+`?.dataset.state === "provisioned"`)
			if withDisk {
				until(ctx, t, "its disk in its row", row+`?.textContent.includes("64 MiB disk")`)
			}
			clickLive(ctx, t, "starting it", `tr[data-id="`+id+`"] button[data-action="start"]`)
			until(ctx, t, "the running sandbox", row+`?.dataset.state === "running"`)

			// A refusal is shown as the problem's detail and code.
			run(ctx, t, "creating it again",
				chromedp.SendKeys(chromedp.CSS("#create-id"), id),
				chromedp.Click(chromedp.CSS("#create-submit")))
			until(ctx, t, "the conflict explained", `!document.querySelector("#error").hidden && document.querySelector("#error-text").textContent.includes("(already-provisioned)")`)
			run(ctx, t, "dismissing it", chromedp.Click(chromedp.CSS("#error-close")))

			// The terminal: a shell on a pseudo-terminal over the exec websocket.
			clickLive(ctx, t, "opening the terminal", `tr[data-id="`+id+`"] button[data-action="terminal"]`)
			until(ctx, t, "the terminal to connect", `document.querySelector("#terminal-status").textContent === "connected"`)
			// The shell's prompt first: keys typed before it are echoed ahead of it, and the
			// output then shares the prompt's line.
			until(ctx, t, "the shell's prompt",
				`[...document.querySelectorAll("#terminal .xterm-rows > div")].some(r => r.textContent.trim().endsWith("$"))`)
			run(ctx, t, "typing into the terminal",
				chromedp.Click(chromedp.CSS("#terminal .xterm-screen")),
				typeKeys("echo hello\r"))
			// The output line, not the echoed command line, reads exactly "hello".
			until(ctx, t, "hello in the terminal",
				`[...document.querySelectorAll("#terminal .xterm-rows > div")].some(r => r.textContent.trim() === "hello")`)

			saveScreenshot(ctx, t, "terminal")

			// The shell has the terminal's size, and follows it when the window changes.
			rowsOf := `[...document.querySelectorAll("#terminal .xterm-rows > div")].map(r => r.textContent.trim())`
			sized := func(what string) {
				t.Helper()
				size, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#terminal").dataset.size`))
				if err != nil || size == "" {
					t.Fatalf("the terminal's size: %q %v", size, err)
				}
				run(ctx, t, "asking the size", typeKeys("clear; stty size\r"))
				until(ctx, t, what+" ("+size+")", rowsOf+`.includes("`+size+`")`)
			}
			sized("stty size to match the terminal")
			before, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#terminal").dataset.size`))
			run(ctx, t, "narrowing the window", chromedp.EmulateViewport(900, 1000))
			until(ctx, t, "the terminal to refit", `document.querySelector("#terminal").dataset.size !== "`+before+`"`)
			sized("stty size to follow the resize")
			run(ctx, t, "restoring the window", chromedp.EmulateViewport(1280, 1000))

			// Pause and resume; the event log shows both.
			clickLive(ctx, t, "pausing it", `tr[data-id="`+id+`"] button[data-action="pause"]`)
			until(ctx, t, "the paused sandbox", row+`?.dataset.state === "paused"`)
			until(ctx, t, "the pause in the event log", `[...document.querySelectorAll("#events li")].some(li => li.dataset.type === "sandbox.paused" && li.textContent.includes("`+id+`"))`)
			clickLive(ctx, t, "resuming it", `tr[data-id="`+id+`"] button[data-action="resume"]`)
			until(ctx, t, "the resumed sandbox", row+`?.dataset.state === "running"`)

			// Stop, then delete (a destructive button asks for a second click).
			clickLive(ctx, t, "stopping it", `tr[data-id="`+id+`"] button[data-action="stop"]`)
			until(ctx, t, "the stopped sandbox", row+`?.dataset.state === "stopped"`)
			del := `tr[data-id="` + id + `"] button[data-action="delete"]`
			clickLive(ctx, t, "deleting it", del)
			until(ctx, t, "the delete button to ask again", `document.querySelector('tr[data-id="`+id+`"] button[data-action="delete"]').textContent === "Sure?"`)
			clickLive(ctx, t, "confirming", del)
			until(ctx, t, "the row to go", row+` === null`)
			until(ctx, t, "the deletion in the event log", `[...document.querySelectorAll("#events li")].some(li => li.dataset.type === "sandbox.deleted" && li.textContent.includes("`+id+`"))`)

			if errText, err := chromedp.Run(ctx, pageError()); err != nil || errText != "" {
				t.Fatalf("the page shows an error at the end: %q (%v)", errText, err)
			}
			if sb := d.do("GET", "/v1/sandboxes/"+id, nil, nil); sb.Status != 404 {
				t.Fatalf("the sandbox still exists: %d %s", sb.Status, sb.Body)
			}
		})
	}
}

// TestDashboardTemplates drives the template views: create a template, capture a stopped
// sandbox into it, clone the generation, follow a capture of the clone to its parent, tombstone
// and retire it (draining until its clone is deleted), and delete the template.
func TestDashboardTemplates(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	// Capture takes a sandbox that has run and stopped.
	d.create("tpl-src", true)
	if r := d.doJSON("POST", "/v1/sandboxes/tpl-src/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	ctx := browser(t)
	click := func(what, sel string) { clickLive(ctx, t, what, sel) }
	gen := `document.querySelector('[data-template="tools"] tr[data-generation]')`

	run(ctx, t, "opening the dashboard by its login URL", chromedp.Navigate(d.LoginURL()))
	until(ctx, t, "live events", `document.querySelector("#live").textContent === "live"`)
	run(ctx, t, "opening the templates page", chromedp.Navigate(d.URL+"/#/templates"))
	until(ctx, t, "the templates page", `!document.querySelector("#view-templates").hidden`)
	run(ctx, t, "creating a template",
		chromedp.SendKeys(chromedp.CSS("#template-name"), "tools"),
		chromedp.Click(chromedp.CSS(`#template-form button[type="submit"]`)))
	until(ctx, t, "the template", `document.querySelector('[data-template="tools"]') !== null`)

	click("choosing the sandbox to capture", `tr[data-id="tpl-src"] button[data-action="capture"]`)
	run(ctx, t, "capturing it",
		chromedp.SendKeys(chromedp.CSS("#capture-template"), "tools"),
		chromedp.Click(chromedp.CSS(`#capture-form button[type="submit"]`)))
	until(ctx, t, "an eligible generation", gen+`?.textContent.includes("eligible")`)
	until(ctx, t, "the capture reported", `document.querySelector("#capture-status").textContent === "tpl-src → tools: captured as " + `+gen+`.dataset.generation`)

	click("cloning it", `[data-template="tools"] button[data-action="clone"]`)
	until(ctx, t, "a running clone", `[...document.querySelectorAll("#sandboxes tr[data-id]")].some(r => r.dataset.id !== "tpl-src" && r.dataset.state === "running" && r.textContent.includes("tools @ "))`)
	until(ctx, t, "the lease counted", gen+`?.children[5].textContent === "1"`)
	until(ctx, t, "the clone named as the lease's holder", gen+`?.querySelector("td.holders a[data-sandbox-link]") !== null`)
	clone, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll("#sandboxes tr[data-id]")].find(r => r.dataset.id !== "tpl-src").dataset.id`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+clone+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+clone, nil)
	})

	// Lineage: the generation names the sandbox it was captured from; a capture of the clone
	// names the clone and, as its parent, the generation the clone was made from, which a
	// click brings into view.
	until(ctx, t, "the generation's source", gen+`?.querySelector('td.lineage a[data-sandbox-link="tpl-src"]') !== null`)
	run(ctx, t, "creating a second template",
		chromedp.SendKeys(chromedp.CSS("#template-name"), "tools-child"),
		chromedp.Click(chromedp.CSS(`#template-form button[type="submit"]`)))
	until(ctx, t, "the second template", `document.querySelector('[data-template="tools-child"]') !== null`)
	click("choosing the clone to capture", `tr[data-id="`+clone+`"] button[data-action="capture"]`)
	run(ctx, t, "capturing the clone",
		chromedp.SetValue(chromedp.CSS("#capture-template"), "tools-child"),
		chromedp.Click(chromedp.CSS(`#capture-form button[type="submit"]`)))
	child := `document.querySelector('[data-template="tools-child"] tr[data-generation]')`
	until(ctx, t, "the child's lineage", child+`?.querySelector('td.lineage a[data-sandbox-link="`+clone+`"]') != null && `+
		child+`?.querySelector('td.lineage a[data-parent]')?.dataset.parent === "tools@" + `+gen+`?.dataset.generation`)
	click("following the parent", `[data-template="tools-child"] td.lineage a[data-parent]`)
	until(ctx, t, "the parent highlighted", gen+`?.classList.contains("highlight")`)
	if r := d.do("DELETE", "/v1/templates/tools-child", nil, nil); r.Status != 204 {
		t.Fatalf("deleting the child's template: %d %s", r.Status, r.Body)
	}

	for _, action := range []string{"tombstone", "retire"} {
		sel := `[data-template="tools"] button[data-action="` + action + `"]`
		click(action, sel)
		until(ctx, t, action+" to ask again", `document.querySelector('`+sel+`').textContent === "Sure?"`)
		click("confirming "+action, sel)
		want := map[string]string{"tombstone": "tombstoned", "retire": "retiring"}[action]
		until(ctx, t, "the generation "+want, gen+`?.textContent.includes("`+want+`")`)
	}
	saveScreenshot(ctx, t, "templates")

	// Deleting the clone releases the lease, and the drained generation goes.
	click("stopping the clone", `tr[data-id="`+clone+`"] button[data-action="stop"]`)
	until(ctx, t, "the stopped clone", `document.querySelector('tr[data-id="`+clone+`"]')?.dataset.state === "stopped"`)
	click("deleting the clone", `tr[data-id="`+clone+`"] button[data-action="delete"]`)
	click("confirming", `tr[data-id="`+clone+`"] button[data-action="delete"]`)
	until(ctx, t, "the generation to go", `document.querySelector('[data-template="tools"]') !== null && `+gen+` === null`)

	del := `[data-template="tools"] button[data-action="delete-template"]`
	click("deleting the template", del)
	until(ctx, t, "delete to ask again", `document.querySelector('`+del+`').textContent === "Sure?"`)
	click("confirming", del)
	until(ctx, t, "the template to go", `document.querySelector('[data-template="tools"]') === null`)
	if msg, err := chromedp.Run(ctx, pageError()); err != nil || msg != "" {
		t.Fatalf("the page shows an error at the end: %q (%v)", msg, err)
	}
}

// TestDashboardLogin: the login URL that a default bothyd prints logs the dashboard in once.
// The page trades the code for the token, keeps the token, and takes the code out of the
// address bar; the same URL a second time is refused, and the kept token still works.
func TestDashboardLogin(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	ctx := browser(t)
	login := d.LoginURL()
	if strings.Contains(login, d.Token) || strings.Contains(d.logs.String(), d.Token) {
		t.Fatal("the token itself is in bothyd's log")
	}

	run(ctx, t, "opening the login URL", chromedp.Navigate(login))
	until(ctx, t, "live events", `document.querySelector("#live").textContent === "live" && document.querySelector("#token-panel").hidden`)
	until(ctx, t, "the code out of the address bar", `location.hash === ""`)
	kept, err := chromedp.Run(ctx, chromedp.Evaluate[string](`localStorage.getItem("bothy.token")`))
	if err != nil || kept != d.Token {
		t.Fatalf("the page kept %q (%v), not the server's token", kept, err)
	}

	run(ctx, t, "opening the login URL again", chromedp.Navigate(login))
	until(ctx, t, "the second use refused", `!document.querySelector("#error").hidden && document.querySelector("#error-text").textContent.includes("(unauthorized)")`)
	run(ctx, t, "dismissing it", chromedp.Click(chromedp.CSS("#error-close")))
	until(ctx, t, "live events with the kept token", `document.querySelector("#live").textContent === "live"`)
	d.create("after-login", false)
	until(ctx, t, "the sandbox listed", `document.querySelector('tr[data-id="after-login"]') !== null`)
}
