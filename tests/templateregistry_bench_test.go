package tests

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// BenchmarkTemplateRegistry moves a 100 MiB generation between two bothyds through a
// loopback registry (go-containerregistry's, in the test's process) and reports, per
// iteration (a new template each): the push (from the capture's answer until the registry
// serves its tag), the first clone on the node that lacks it (its pull included), a clone
// on the node that made it, and a later clone on the other node. Clones are provisions
// (not started): what a pull adds is before the start.
func BenchmarkTemplateRegistry(b *testing.B) {
	requireRoot(b)
	const size = 100 << 20
	reg := newCountingRegistry(b)
	start := func() *daemon {
		d := startDaemon(b, withArgs("--log-level", "info", "--template-registry", reg.repo()))
		waitFor(b, vmDeadline, "the microvm runtime's probe", func() bool { return microvmStatus(b, d).State != "probing" })
		return d
	}
	a, c := start(), start()
	var push, firstB, cloneA, laterB latencies
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		name := fmt.Sprintf("reg%d", i)
		src := name + "-src"
		a.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": src, "start": true})
		got := decode[execJSON](b, a.doJSON("POST", "/v1/sandboxes/"+src+"/exec", map[string]any{
			"command": []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /home/user/blob && sync", size)}, "timeout_ms": 600000}), 200)
		if got.ExitCode != 0 {
			b.Fatalf("writing the generation's data: %+v", got)
		}
		a.mustStatus(200, "POST", "/v1/sandboxes/"+src+"/stop", nil)
		a.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": name})
		b.StartTimer()
		g := decode[generationJSON](b, a.doJSON("POST", "/v1/templates/"+name+"/generations", map[string]any{"sandbox": src}), 201)
		t0 := time.Now()
		for {
			resp, err := http.Head(reg.srv.URL + "/v2/bothy/templates/manifests/" + name + "." + g.ID)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Since(t0) > 5*time.Minute {
				b.Fatal("the push did not finish in 5 minutes")
			}
			time.Sleep(5 * time.Millisecond)
		}
		push = append(push, time.Since(t0))
		timed := func(d *daemon, id string) time.Duration {
			t := time.Now()
			d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "template": name, "generation": g.ID})
			return time.Since(t)
		}
		firstB = append(firstB, timed(c, name+"-b1"))
		cloneA = append(cloneA, timed(a, name+"-a1"))
		laterB = append(laterB, timed(c, name+"-b2"))
		b.StopTimer()
		for _, id := range []string{name + "-b1", name + "-b2"} {
			c.mustStatus(204, "DELETE", "/v1/sandboxes/"+id, nil)
		}
		for _, id := range []string{name + "-a1", src} {
			a.mustStatus(204, "DELETE", "/v1/sandboxes/"+id, nil)
		}
		b.StartTimer()
	}
	push.report(b, "push-")
	firstB.report(b, "first-clone-other-")
	cloneA.report(b, "clone-origin-")
	laterB.report(b, "later-clone-other-")
}
