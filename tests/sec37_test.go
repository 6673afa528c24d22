package tests

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// rawRequest sends one request on a fresh connection from local (an address of lo: a
// client of its own) and reads the answer's status and body.
func rawRequest(t *testing.T, d *daemon, local, method, path string, header http.Header, body string) (int, string) {
	t.Helper()
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}).Dial("tcp", strings.TrimPrefix(d.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	req, err := http.NewRequest(method, d.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if h := header.Get("Host"); h != "" {
		req.Host = h
	}
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestE2BRoutesHaveTheBrowserDefences (issue 37, item 3): E2B's control and envd planes
// answer a foreign Host (DNS rebinding) and a foreign Origin as bothyd's own routes do, a
// refused client's slow body is not waited for, and E2B metadata is held to the label rules.
func TestE2BRoutesHaveTheBrowserDefences(t *testing.T) {
	t.Parallel()
	open := startDaemon(t, withoutAuth())
	simple := http.Header{"Content-Type": {"text/plain"}} // a simple request: no preflight
	for _, c := range []struct {
		name   string
		header http.Header
	}{
		{"rebound Host", http.Header{"Host": {"rebind.example:7780"}}},
		{"foreign Origin", http.Header{"Origin": {"http://evil.example"}}},
	} {
		t.Run("no token, "+c.name, func(t *testing.T) {
			h := c.header.Clone()
			for k, v := range simple {
				h[k] = v
			}
			for _, p := range []struct{ method, path string }{{"POST", "/sandboxes"}, {"POST", "/v2/sandboxes"}, {"GET", "/v2/sandboxes"}} {
				if status, body := rawRequest(t, open, "127.0.0.1", p.method, p.path, h, `{"templateID":"base"}`); status != http.StatusForbidden {
					t.Errorf("%s %s with a %s: %d %s, want 403", p.method, p.path, c.name, status, body)
				}
			}
			envd := h.Clone()
			envd.Set("E2b-Sandbox-Id", "anyone")
			if status, body := rawRequest(t, open, "127.0.0.1", "GET", "/files?path=/etc/passwd", envd, ""); status != http.StatusForbidden {
				t.Errorf("envd's GET /files with a %s: %d %s, want 403", c.name, status, body)
			}
		})
	}
	var list struct{ Items []any }
	if r := open.do("GET", "/v1/sandboxes", nil, nil); r.Status != 200 || json.Unmarshal(r.Body, &list) != nil || len(list.Items) != 0 {
		t.Fatalf("after the refusals: %d %s, want no sandbox", r.Status, r.Body)
	}

	d := startDaemon(t)
	key := http.Header{"X-Api-Key": {"e2b_" + d.Token}, "Content-Type": {"application/json"}}
	t.Run("token, foreign Origin", func(t *testing.T) {
		h := key.Clone()
		h.Set("Origin", "http://evil.example")
		if status, body := rawRequest(t, d, "127.0.0.1", "GET", "/v2/sandboxes", h, ""); status != http.StatusForbidden {
			t.Errorf("E2B's list with the API key from a foreign Origin: %d %s, want 403", status, body)
		}
	})
	t.Run("metadata is held to the label rules", func(t *testing.T) {
		spaced := map[string]string{"team": "a value with spaces"}
		many := map[string]string{}
		for i := range 80 {
			many[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 60)
		}
		long := map[string]string{"team": strings.Repeat("v", 228)}
		for name, md := range map[string]map[string]string{"spaces": spaced, "80 keys": many, "a long value": long} {
			b, _ := json.Marshal(map[string]any{"templateID": "base", "metadata": md})
			if status, body := rawRequest(t, d, "127.0.0.1", "POST", "/sandboxes", key, string(b)); status != http.StatusBadRequest || !strings.Contains(body, "metadata") {
				t.Errorf("metadata with %s: %d %s, want 400 naming the metadata", name, status, body)
			}
		}
	})
	t.Run("a refused slow body is not waited for", func(t *testing.T) {
		addr := strings.TrimPrefix(d.URL, "http://")
		for _, head := range []string{
			"POST /sandboxes HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n{",
			"POST /files?path=/tmp/x HTTP/1.1\r\nHost: " + addr + "\r\nE2b-Sandbox-Id: abc\r\nContent-Type: application/octet-stream\r\nContent-Length: 200000\r\n\r\nx",
		} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			// The server gives a body a minute; half of that fails a refusal that waited.
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.WriteString(c, head); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%q, its body unsent, got no answer: %v", head[:20], err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%q without credentials: %d, want 401", head[:20], resp.StatusCode)
			}
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				t.Errorf("%q: the connection was not closed after the 401: %v", head[:20], err)
			}
			c.Close()
		}
	})
}

// openFDs counts the descriptors of process pid.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestStreamFloodFromOneClient (issue 37, item 4): one client (127.0.0.2) opening hundreds
// of event streams, E2B watches and idle connections gets its share and 429 past it, while
// /healthz, lists and another client's event stream (127.0.0.1) still answer, and the
// server's descriptors stay below the bound.
func TestStreamFloodFromOneClient(t *testing.T) {
	t.Parallel()
	const (
		perClientConns   = 256 // server.DefaultMaxConnsPerClient
		perClientStreams = 32  // server.MaxStreamsPerClient
		refusing         = 64  // server's refused connections lingering at most
	)
	d := startDaemon(t)
	pid := d.cmd.Process.Pid
	before := openFDs(t, pid)
	addr := strings.TrimPrefix(d.URL, "http://")
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 10 * time.Second}

	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	statuses := map[int]int{}
	open := func(req string) {
		c, err := dialer.Dial("tcp", addr)
		if err != nil {
			mu.Lock()
			statuses[-1]++
			mu.Unlock()
			return
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		status := 0
		if req != "" {
			if _, err := io.WriteString(c, req); err == nil {
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					status = resp.StatusCode
				}
			}
		}
		_ = c.SetDeadline(time.Time{})
		mu.Lock()
		conns = append(conns, c)
		statuses[status]++
		mu.Unlock()
	}
	events := "GET /v1/events HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + d.Token + "\r\n\r\n"
	watch := "POST /filesystem.Filesystem/WatchDir HTTP/1.1\r\nHost: " + addr + "\r\nE2b-Sandbox-Id: abc\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	var wg sync.WaitGroup
	for i := range 400 {
		req := events
		switch i % 4 {
		case 1:
			req = watch
		case 2:
			req = "" // an idle connection
		}
		wg.Add(1)
		go func() { defer wg.Done(); open(req) }()
	}
	wg.Wait()
	t.Logf("the flood's answers (0: none, an idle connection or one cut): %v", statuses)
	if statuses[http.StatusOK] > perClientStreams {
		t.Errorf("one client opened %d event streams, more than its %d", statuses[http.StatusOK], perClientStreams)
	}
	if statuses[http.StatusTooManyRequests] == 0 {
		t.Errorf("no request of the flood was answered 429: %v", statuses)
	}

	if r := d.do("GET", "/healthz", nil, nil); r.Status != 200 {
		t.Fatalf("/healthz during the flood: %d %s", r.Status, r.Body)
	}
	if r := d.do("GET", "/v1/sandboxes", nil, nil); r.Status != 200 {
		t.Fatalf("a list during the flood: %d %s", r.Status, r.Body)
	}
	if status, _ := func() (int, string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.WriteString(c, events)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err.Error()
		}
		return resp.StatusCode, ""
	}(); status != http.StatusOK {
		t.Fatalf("another client's event stream during the flood: %d", status)
	}
	fds, bound := openFDs(t, pid), before+perClientConns+refusing+16
	t.Logf("the server's descriptors: %d before the flood, %d during it (bound %d)", before, fds, bound)
	if fds > bound {
		t.Fatalf("the server holds %d descriptors during one client's flood, more than %d (%d before it)", fds, bound, before)
	}
}

// TestPortPageSeesNoCredential (issue 37, item 2): a port page opened the way a browser
// opens one (a link) can see no credential of the API, in its URL, its cookies, its
// referrer or its storage, and neither can its service in any request's line or headers,
// raw, URL-escaped or in base64; the old way (the token in the port URL) is refused before
// the service, whatever the escaping of the parameter's name.
func TestPortPageSeesNoCredential(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the port tests run python3 from the host's /usr, which has none")
	}
	ctx := browser(t)
	d := startDaemon(t)
	d.create("pg", true)
	script, err := os.ReadFile("testdata/pageserver.py")
	if err != nil {
		t.Fatal(err)
	}
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	if r := d.do("PUT", "/v1/sandboxes/pg/files?path=/home/user/pageserver.py", bytes.NewReader(script), octet); r.Status != 204 {
		t.Fatalf("writing the service: %d %s", r.Status, r.Body)
	}
	if got := d.exec("pg", map[string]any{"command": []string{"sh", "-c",
		"setsid python3 /home/user/pageserver.py >/home/user/pageserver.log 2>&1 </dev/null &"}}); got.ExitCode != 0 {
		t.Fatalf("starting the service: %+v", got)
	}
	waitFor(t, 30*time.Second, "the page service to answer", func() bool {
		return d.do("GET", "/v1/sandboxes/pg/ports/8001/log", nil, nil).Status == 200
	})

	// The dashboard holds the token in this browser, as it does for its user.
	run(ctx, t, "opening the dashboard by its login URL", chromedp.Navigate(d.LoginURL()))
	until(ctx, t, "the dashboard to log in", `localStorage.length > 0`)

	// The old way, and its escaped variants: refused by bothyd, never served.
	for _, q := range []string{"access_token=", "access%5Ftoken=", "ACCESS_TOKEN=", "access_token%3D"} {
		if r := d.do("GET", "/v1/sandboxes/pg/ports/8001/?"+q+url.QueryEscape(d.Token), nil, http.Header{"Authorization": {""}}); r.Status != 401 {
			t.Errorf("the port with ?%s<token>: %d, want 401", q, r.Status)
		}
	}
	run(ctx, t, "opening the port with the token in its URL", chromedp.Navigate(d.URL+"/v1/sandboxes/pg/ports/8001/?access_token="+url.QueryEscape(d.Token)))
	until(ctx, t, "the port with the token in its URL to be refused, or to report",
		`document.title == "reported" || document.contentType == "application/problem+json"`)

	// The way a browser opens a port: a link.
	var link struct{ Path, Token string }
	if r := d.doJSON("POST", "/v1/sandboxes/pg/ports/8001/links", map[string]any{"ttl_s": 600}); r.Status != 201 || json.Unmarshal(r.Body, &link) != nil {
		t.Fatalf("making a link: %d %s", r.Status, r.Body)
	}
	run(ctx, t, "opening the port page by its link", chromedp.Navigate(d.URL+link.Path))
	until(ctx, t, "the page to report what it sees", `document.title == "reported"`)
	clickLive(ctx, t, "the page's link to next", "#next")
	waitFor(t, 30*time.Second, "the service to see the next page", func() bool {
		return bytes.Contains(d.do("GET", "/v1/sandboxes/pg/ports/8001/log", nil, nil).Body, []byte("next?from=page"))
	})

	r := d.do("GET", "/v1/sandboxes/pg/ports/8001/log", nil, nil)
	if r.Status != 200 {
		t.Fatalf("the service's log: %d %s", r.Status, r.Body)
	}
	var seen []byte
	for _, line := range strings.Split(strings.TrimSpace(string(r.Body)), "\n") {
		var e struct{ Line, Headers string }
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("the service's log line %q: %v", line, err)
		}
		if strings.Contains(e.Line, "/report?d=") {
			u, _ := url.Parse(strings.Fields(e.Line)[1])
			report, _ := base64.StdEncoding.DecodeString(u.Query().Get("d"))
			seen = append(seen, report...)
			seen = append(seen, '\n')
		}
	}
	if seen == nil {
		t.Fatalf("the page's report did not reach its service: %s", r.Body)
	}
	t.Logf("the page saw %s", seen)
	// The link's page reports, and so may the next page once it loads: judge the link's.
	var page struct{ URL, Cookie, Referrer, Storage string }
	found := false
	for _, report := range bytes.Split(bytes.TrimSpace(seen), []byte("\n")) {
		if err := json.Unmarshal(report, &page); err != nil {
			t.Fatalf("the page's report %s: %v", report, err)
		}
		if found = strings.HasSuffix(page.URL, link.Path); found {
			break
		}
	}
	if !found {
		t.Fatalf("the page's reports %s: none has the link's URL", seen)
	}
	if page.Storage != "denied" {
		t.Errorf("the page read this origin's storage: %s", page.Storage)
	}
	everything := string(r.Body) + "\n" + string(seen)
	for name, form := range credentialForms(d.Token) {
		if strings.Contains(everything, form) {
			t.Errorf("the API token (%s) reached the page or its service", name)
		}
	}
}

// credentialForms are the encodings a credential could travel in.
func credentialForms(secret string) map[string]string {
	b := []byte(secret)
	return map[string]string{
		"raw":              secret,
		"query-escaped":    url.QueryEscape(secret),
		"path-escaped":     url.PathEscape(secret),
		"base64":           base64.StdEncoding.EncodeToString(b),
		"base64, unpadded": base64.RawStdEncoding.EncodeToString(b),
		"base64url":        base64.RawURLEncoding.EncodeToString(b),
	}
}

// envdAccessToken is sandbox id's E2B envd access token under token (e2b.Handler's).
func envdAccessToken(token, id string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("bothyd e2b envd access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// TestWatchFloodFromOneClient (issue 37, item 4): one client opening E2B WatchDir streams on
// a running sandbox holds MaxStreamsPerClient of them and is answered 429 past that, while
// another client's watch still opens and /healthz answers.
func TestWatchFloodFromOneClient(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const perClientStreams = 32 // server.MaxStreamsPerClient
	d := startDaemon(t)
	d.create("watched", true)
	addr := strings.TrimPrefix(d.URL, "http://")
	var body bytes.Buffer
	msg := []byte(`{"path":"/tmp"}`)
	body.WriteByte(0)
	_ = binary.Write(&body, binary.BigEndian, uint32(len(msg)))
	body.Write(msg)
	watch := "POST /filesystem.Filesystem/WatchDir HTTP/1.1\r\nHost: " + addr + "\r\nE2b-Sandbox-Id: watched\r\n" +
		"X-Access-Token: " + envdAccessToken(d.Token, "watched") + "\r\nContent-Type: application/connect+json\r\n" +
		"Content-Length: " + strconv.Itoa(body.Len()) + "\r\n\r\n" + body.String()
	// open sends a watch from local and returns the status and the connection, held open.
	open := func(local string) (int, net.Conn) {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, watch); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("a watch from %s: %v", local, err)
		}
		if resp.StatusCode == http.StatusOK {
			// The start event arrives once the watch is set up: the watch is held.
			var head [5]byte
			if _, err := io.ReadFull(resp.Body, head[:]); err != nil || head[0] != 0 {
				t.Fatalf("a watch from %s: no start event (%v, flags %d)", local, err, head[0])
			}
		}
		_ = c.SetDeadline(time.Time{})
		return resp.StatusCode, c
	}
	held := 0
	for range perClientStreams + 8 {
		switch status, _ := open("127.0.0.6"); status {
		case http.StatusOK:
			held++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("a watch of the flood: %d", status)
		}
	}
	if held != perClientStreams {
		t.Fatalf("one client holds %d watches, want its %d", held, perClientStreams)
	}
	if status, _ := open("127.0.0.1"); status != http.StatusOK {
		t.Fatalf("another client's watch during the flood: %d", status)
	}
	if r := d.do("GET", "/healthz", nil, nil); r.Status != 200 {
		t.Fatalf("/healthz during the flood: %d", r.Status)
	}
}
