package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// specExample is one example of a response in the contract: the operation, status and media
// type it is under, its name there, its value (decoded as JSON decodes, so that its types are
// JSON's) and the schema of the response.
type specExample struct {
	op, method, path, status, media, name string
	value                                 any
	schema                                *openapi3.Schema
}

func (e specExample) key() string { return e.op + " " + e.status + " " + e.name }

// responseExamples lists every example of a JSON response in doc, and of the event stream's
// data (text/event-stream, whose data lines are JSON), in a stable order.
func responseExamples(t *testing.T, doc *openapi3.T) []specExample {
	t.Helper()
	var out []specExample
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status, r := range op.Responses.Map() {
				if r.Value == nil {
					continue
				}
				for media, c := range r.Value.Content {
					var schema *openapi3.Schema
					if c.Schema != nil {
						schema = c.Schema.Value
					}
					add := func(name string, v any) {
						b, err := json.Marshal(v)
						if err != nil {
							t.Fatalf("%s %s %s example %s: %v", op.OperationID, status, media, name, err)
						}
						var value any
						if err := json.Unmarshal(b, &value); err != nil {
							t.Fatal(err)
						}
						out = append(out, specExample{op.OperationID, method, path, status, media, name, value, schema})
					}
					for name, ex := range c.Examples {
						if ex.Value != nil {
							add(name, ex.Value.Value)
						}
					}
					if c.Example == nil {
						continue
					}
					if media != "text/event-stream" {
						add("example", c.Example)
						continue
					}
					// An event stream's example is its text; its data lines are Events.
					text, _ := c.Example.(string)
					for i, line := range strings.Split(text, "\n") {
						if data, ok := strings.CutPrefix(line, "data: "); ok {
							var v any
							if err := json.Unmarshal([]byte(data), &v); err != nil {
								t.Fatalf("%s: the example's data line %q is not JSON: %v", op.OperationID, data, err)
							}
							out = append(out, specExample{op.OperationID, method, path, status, media, fmt.Sprintf("data%d", i), v, doc.Components.Schemas["Event"].Value})
						}
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key() < out[j].key() })
	return out
}

// jsonKind names the JSON type of v, as encoding/json decodes into any.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// objectSchema is what a schema says of an object's members: its named properties (allOf
// merged), and the schema of any other member when it is a map (labels).
func objectSchema(s *openapi3.Schema) (props map[string]*openapi3.Schema, extra *openapi3.Schema) {
	props = map[string]*openapi3.Schema{}
	var walk func(*openapi3.Schema)
	walk = func(s *openapi3.Schema) {
		if s == nil {
			return
		}
		for name, p := range s.Properties {
			props[name] = p.Value
		}
		if s.AdditionalProperties.Schema != nil && s.AdditionalProperties.Schema.Value != nil {
			extra = s.AdditionalProperties.Schema.Value
		}
		for _, sub := range s.AllOf {
			walk(sub.Value)
		}
	}
	walk(s)
	return props, extra
}

// shapeDiff says where the shape of an example and of a real answer differ: a member that one
// has and the other has not, or a value of another JSON type. Values themselves may differ.
// A map (an object whose schema names no properties, such as labels) is compared by the
// types of its values alone, an array by its first elements (when both have one).
func shapeDiff(at string, s *openapi3.Schema, example, real any) []string {
	if ek, rk := jsonKind(example), jsonKind(real); ek != rk {
		return []string{fmt.Sprintf("%s: the example has a %s, the server a %s", at, ek, rk)}
	}
	var diffs []string
	switch ex := example.(type) {
	case map[string]any:
		re := real.(map[string]any)
		props, extra := objectSchema(s)
		if len(props) == 0 && extra != nil {
			for k, v := range ex {
				for _, w := range re {
					diffs = append(diffs, shapeDiff(at+"."+k, extra, v, w)...)
					break
				}
			}
			return diffs
		}
		for _, k := range sortedKeys(ex, re) {
			ev, inEx := ex[k]
			rv, inReal := re[k]
			switch {
			case !inReal:
				diffs = append(diffs, fmt.Sprintf("%s.%s: in the example, not in the server's answer", at, k))
			case !inEx:
				diffs = append(diffs, fmt.Sprintf("%s.%s: in the server's answer, not in the example", at, k))
			default:
				diffs = append(diffs, shapeDiff(at+"."+k, props[k], ev, rv)...)
			}
		}
	case []any:
		re := real.([]any)
		if len(ex) > 0 && len(re) > 0 {
			var items *openapi3.Schema
			if s != nil && s.Items != nil {
				items = s.Items.Value
			}
			diffs = append(diffs, shapeDiff(at+"[0]", items, ex[0], re[0])...)
		}
	}
	return diffs
}

func sortedKeys(maps ...map[string]any) []string {
	var keys []string
	for _, m := range maps {
		for k := range m {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

// TestContractExamples: every example of a response in the contract (openapi.yaml, as the
// server serves it) has the shape of a real answer of the server to that operation and status:
// the same members, with values of the same JSON types. A scenario makes each answer as the
// example describes it (a running sandbox from the host image with env and labels, a paused
// one, one with a lifetime, one with an egress policy, a stopped clone, a captured generation,
// a pulled and an imported image, a link, a command that exited and one killed at its
// deadline, a wait that succeeds and one that times out, the event stream). Problems with an example are provoked
// per operation where one request can: a 400 by an unknown query parameter (a bad port for the
// proxies, whose query is the service's), a 502 by a port where nothing listens; a 423 (a
// race to provoke per operation) is compared with an exec's sandbox-busy, and a link proxy's
// 400 with the generic one. HEAD answers carry no body: their examples are compared with
// GET's answer. An example that no real answer is found for fails the test, so that a new
// example comes with its check.
func TestContractExamples(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// The registries first, so that they close after bothyd: a stalled pull holds a
	// connection until bothyd goes away.
	img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/app", Cmd: []string{"sh"}}, 2<<20)
	pulledRef := serveRegistry(t, img, "library/busybox:1.36")
	var stall atomic.Bool
	stalling := stallingRegistry(t, &stall)
	stalledRef := strings.TrimPrefix(stalling.URL, "http://") + "/library/busybox:1.36"
	r, err := name.ParseReference(stalledRef)
	if err != nil {
		t.Fatal(err)
	}
	// Another image than the pulled one: layers the server holds already are not downloaded.
	if err := remote.Write(r, busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}}, 3<<20)); err != nil {
		t.Fatal(err)
	}
	stall.Store(true)

	d := startDaemon(t)
	spec := d.do("GET", "/openapi.yaml", nil, nil)
	doc, err := openapi3.NewLoader().LoadFromData(spec.Body)
	if err != nil {
		t.Fatal(err)
	}
	examples := responseExamples(t, doc)
	// real is the server's answer by operation and status; byExample overrides it for one
	// example (an operation whose examples describe different states).
	real := map[string]response{}
	byExample := map[string]response{}
	cleanup := func(id string) {
		t.Cleanup(func() {
			d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
		})
	}

	// Sandboxes and exec.
	cleanup("build-42")
	real["createSandbox 201"] = d.doJSON("POST", "/v1/sandboxes", map[string]any{
		"id": "build-42", "image": "host", "start": true, "env": []string{"CI=true"},
		"labels":    map[string]string{"team": "grading", "job": "42"},
		"resources": map[string]any{"vcpus": 1, "memory_mb": 256, "pids": 64, "disk_mb": 0},
	})
	byExample["getSandbox 200 running"] = d.doJSON("GET", "/v1/sandboxes/build-42", nil)
	real["waitSandbox 200"] = d.doJSON("GET", "/v1/sandboxes/build-42/wait?state=running", nil)
	real["waitSandbox 408"] = d.doJSON("GET", "/v1/sandboxes/build-42/wait?state=stopped&timeout_ms=1", nil)
	// A sandbox without env and labels, as the examples of pause, lifetime and network are.
	cleanup("plain")
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "plain", "start": true}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	real["pauseSandbox 200"] = d.doJSON("POST", "/v1/sandboxes/plain/pause", nil)
	if r := d.doJSON("POST", "/v1/sandboxes/plain/resume", nil); r.Status != 200 {
		t.Fatalf("resume: %d %s", r.Status, r.Body)
	}
	real["setSandboxTimeout 200"] = d.doJSON("POST", "/v1/sandboxes/plain/timeout", map[string]any{"timeout_s": 3600, "on_timeout": "stop"})
	// The egress policy, on a server in a network world of the test's own (network_test.go):
	// a networked sandbox in the host's namespace would leave an interface and nftables
	// objects there, which the `bothyd check` of a test running alongside takes for leaks.
	w := newNetWorld(t)
	nd := startDaemon(t, w.daemon())
	if r := nd.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "net", "start": true}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() {
		nd.doJSON("POST", "/v1/sandboxes/net/stop?force=true", nil)
		nd.doJSON("DELETE", "/v1/sandboxes/net", nil)
	})
	real["setSandboxNetwork 200"] = nd.doJSON("PUT", "/v1/sandboxes/net/network", map[string]any{"allow": []string{"pypi.org", "*.pythonhosted.org"}})
	byExample["execCommand 200 exited"] = d.doJSON("POST", "/v1/sandboxes/build-42/exec", map[string]any{
		"command": []string{"sh", "-c", "echo hello; echo oops >&2; exit 3"}, "timeout_ms": 10000})
	byExample["execCommand 200 timedOut"] = d.doJSON("POST", "/v1/sandboxes/build-42/exec", map[string]any{
		"command": []string{"sleep", "10"}, "timeout_ms": 200})
	busy := make(chan response, 1)
	go func() {
		busy <- d.in(t).doJSON("POST", "/v1/sandboxes/build-42/exec", map[string]any{"command": []string{"sleep", "3"}})
	}()
	var locked response
	waitFor(t, 30*time.Second, "an exec to answer sandbox-busy behind another", func() bool {
		locked = d.doJSON("POST", "/v1/sandboxes/build-42/exec", map[string]any{"command": []string{"true"}, "wait_ms": 1})
		return locked.Status == 423
	})
	<-busy

	// Ports: a link, and the proxies where nothing listens.
	real["createPortLink 201"] = d.doJSON("POST", "/v1/sandboxes/build-42/ports/8000/links", map[string]any{"ttl_s": 600})
	var link struct {
		Token string `json:"token"`
	}
	_ = json.Unmarshal(real["createPortLink 201"].Body, &link)
	real["listPortLinks 200"] = d.do("GET", "/v1/sandboxes/build-42/ports/8000/links", nil, nil)
	real["listSandboxLinks 200"] = d.do("GET", "/v1/sandboxes/build-42/links", nil, nil)
	for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		op := strings.ToUpper(m[:1]) + strings.ToLower(m[1:])
		real["portProxy"+op+" 502"] = d.do(m, "/v1/sandboxes/build-42/ports/8000/x", nil, nil)
		real["linkProxy"+op+" 502"] = d.do(m, "/p/"+link.Token+"/x", nil, http.Header{"Authorization": nil})
	}
	real["portProxyHead 502"], real["linkProxyHead 502"] = real["portProxyGet 502"], real["linkProxyGet 502"]
	real["portTunnel 502"] = d.do("GET", "/v1/sandboxes/build-42/ports/8000/tcp", nil, http.Header{
		"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}})

	// Templates, generations and a clone.
	real["createTemplate 201"] = d.doJSON("POST", "/v1/templates", map[string]any{"name": "python-base"})
	d.doJSON("POST", "/v1/sandboxes/build-42/stop", nil)
	real["captureGeneration 201"] = d.doJSON("POST", "/v1/templates/python-base/generations", map[string]any{"sandbox": "build-42"})
	var gen struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(real["captureGeneration 201"].Body, &gen)
	real["getGeneration 200"] = d.doJSON("GET", "/v1/templates/python-base/generations/"+gen.ID, nil)
	real["getTemplate 200"] = d.doJSON("GET", "/v1/templates/python-base", nil)
	// A capture of a running sandbox, and a retirement that drains, on a template of their own.
	d.doJSON("POST", "/v1/templates", map[string]any{"name": "live-base"})
	cleanup("live-src")
	d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "live-src", "start": true})
	byExample["captureGeneration 201 capturedRunning"] = d.doJSON("POST", "/v1/templates/live-base/generations", map[string]any{"sandbox": "live-src"})
	var live struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(byExample["captureGeneration 201 capturedRunning"].Body, &live)
	cleanup("live-7")
	d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "live-7", "template": "live-base"})
	byExample["retireGeneration 202 retiring"] = d.doJSON("DELETE", "/v1/templates/live-base/generations/"+live.ID+"?drain=true", nil)
	cleanup("py-7")
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "py-7", "template": "python-base", "start": true}); r.Status != 201 {
		t.Fatalf("clone: %d %s", r.Status, r.Body)
	}
	d.doJSON("POST", "/v1/sandboxes/py-7/stop", nil)
	byExample["getSandbox 200 clone"] = d.doJSON("GET", "/v1/sandboxes/py-7", nil)
	real["getInfo 200"] = d.doJSON("GET", "/v1/info", nil)

	// Images: an import, a pull (used by a sandbox), and a pull in the middle of a layer.
	real["importImage 201"] = d.do("PUT", "/v1/images/imported", strings.NewReader(string(dockerSave(t, img))), http.Header{"Content-Type": {"application/octet-stream"}})
	decode[imageJSON](t, d.doJSON("POST", "/v1/images", map[string]any{"ref": pulledRef, "name": "busybox"}), 202)
	d.waitImage("busybox")
	d.createOn("on-busybox", "busybox")
	real["getImage 200"] = d.doJSON("GET", "/v1/images/busybox", nil)
	decode[imageJSON](t, d.doJSON("POST", "/v1/images", map[string]any{"ref": stalledRef, "name": "stalled"}), 202)
	waitFor(t, time.Minute, "the pull to be in the middle of a layer", func() bool {
		img := decode[imageJSON](t, d.doJSON("GET", "/v1/images/stalled", nil), 200)
		for _, l := range img.Layers {
			if l.BytesDone != nil && *l.BytesDone > 0 {
				return true
			}
		}
		return false
	})
	// The pull is running: asked again, the server answers 202 with its progress.
	real["pullImage 202"] = d.doJSON("POST", "/v1/images", map[string]any{"ref": stalledRef, "name": "stalled"})

	// Webhooks: a new one, and one whose receiver's name resolves to loopback, where
	// deliveries never go (this server has no --webhook-allow-private): its first attempt is
	// refused, and it waits for the next.
	real["createWebhook 201"] = d.doJSON("POST", "/v1/webhooks", map[string]any{"url": "https://hooks.example.com/bothy",
		"events": []string{"sandbox.created", "sandbox.deleted", "sandbox.stopped"}, "secret": "9f8e7d6c5b4a39281706f5e4d3c2b1a0"})
	failing := decode[webhookJSON](t, d.doJSON("POST", "/v1/webhooks", map[string]any{"url": "http://localhost:9/bothy",
		"events": []string{"sandbox.created"}, "secret": "9f8e7d6c5b4a39281706f5e4d3c2b1a0"}), 201)
	d.create("for-webhook", false)
	waitFor(t, 30*time.Second, "a refused delivery", func() bool {
		real["getWebhook 200"] = d.doJSON("GET", "/v1/webhooks/"+failing.ID, nil)
		return strings.Contains(string(real["getWebhook 200"].Body), "last_attempt_at")
	})

	// Problems: each operation's 400, and the shared 423 and 502.
	generic400 := d.doJSON("GET", "/v1/sandboxes?contract_probe=1", nil)
	subst := strings.NewReplacer("{id}", "build-42", "{gen}", gen.ID, "{port}", "8000", "{link}", strings.Repeat("0", 32), "{path}", "x", "{webhook}", failing.ID)
	for _, ex := range examples {
		k := ex.op + " " + ex.status
		if _, ok := real[k]; ok || ex.media != "application/problem+json" {
			continue
		}
		switch {
		case ex.status == "423":
			real[k] = locked
		case ex.status == "400" && strings.HasPrefix(ex.op, "linkProxy"):
			real[k] = generic400
		case ex.status == "400" && ex.op == "dashboardLogin":
			real[k] = d.doJSON("POST", "/login", map[string]any{})
		case ex.status == "400":
			p := subst.Replace(ex.path)
			if strings.HasPrefix(p, "/v1/images") {
				p = strings.Replace(p, "{name}", "busybox", 1)
			}
			p = strings.Replace(p, "{name}", "python-base", 1)
			if strings.HasPrefix(ex.op, "portProxy") || ex.op == "portTunnel" {
				p = strings.Replace(p, "/ports/8000", "/ports/0", 1)
			} else {
				p += "?contract_probe=1"
			}
			method := strings.ToUpper(ex.method)
			if method == "HEAD" {
				method = "GET"
			}
			h := http.Header{"Content-Type": {"application/json"}}
			if ex.op == "writeFile" || ex.op == "importImage" {
				h.Set("Content-Type", "application/octet-stream")
			}
			real[k] = d.do(method, p, strings.NewReader("{}"), h)
		}
	}

	// The event stream's history, for the data of its example.
	events := eventHistory(t, d)

	checked := 0
	for _, ex := range examples {
		var got any
		var answer response
		if ex.media == "text/event-stream" {
			typ, _ := ex.value.(map[string]any)["type"].(string)
			e, ok := events[typ]
			if !ok {
				t.Errorf("%s: no %s event in the server's history to compare with", ex.key(), typ)
				continue
			}
			got = e
		} else {
			var ok bool
			if answer, ok = byExample[ex.key()]; !ok {
				if answer, ok = real[ex.op+" "+ex.status]; !ok {
					t.Errorf("%s: no real answer to compare the example with; make one in this test", ex.key())
					continue
				}
			}
			if fmt.Sprint(answer.Status) != ex.status {
				t.Errorf("%s: the server answered %d, not %s: %s", ex.key(), answer.Status, ex.status, answer.Body)
				continue
			}
			if err := json.Unmarshal(answer.Body, &got); err != nil {
				t.Errorf("%s: the server's answer is not JSON: %v: %s", ex.key(), err, answer.Body)
				continue
			}
		}
		for _, diff := range shapeDiff(ex.key(), ex.schema, ex.value, got) {
			t.Error(diff)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no example was checked")
	}
	t.Logf("%d examples compared with the server's answers", checked)
}

// eventHistory reads the event stream from its start (Last-Event-ID: 0) until it has caught
// up with the history, and returns the last event's data of each type.
func eventHistory(t *testing.T, d *daemon) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", d.URL+"/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.Token)
	req.Header.Set("Last-Event-ID", "0")
	resp, err := d.checkedClient(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]any{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			t.Fatalf("an event's data is not JSON: %v: %s", err, data)
		}
		typ, _ := v["type"].(string)
		out[typ] = v
		// on-busybox is the last sandbox the scenario starts: its start is far enough.
		if typ == "sandbox.started" && v["sandbox"] == "on-busybox" {
			return out
		}
	}
	t.Fatalf("the event stream ended before its history did: %v", sc.Err())
	return nil
}
