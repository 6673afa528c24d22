//go:build linux

package namespace

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// rssKiB returns the resident set size of pid in KiB.
func rssKiB(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
	}
	return 0
}

// pssKiB returns the proportional set size of pid in KiB: its private pages plus its share
// of pages shared with other processes (the bothyd binary's, above all).
func pssKiB(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Pss:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
	}
	return 0
}

// BenchmarkStart measures Start until the agent answers hello on the control socket. Stopping
// the sandbox is outside the timer. It also reports the memory of an idle sandbox right after
// hello, summed over the shim and every process in the sandbox's cgroup: as RSS (which counts
// the bothyd binary's pages once per process) and as PSS (which shares them out).
//
// It runs twice in one run: "userns" is the default, each sandbox in a user namespace of its
// own with idmapped layers; "hostids" is the same start without one (Config.IDs.Off), for
// what the user namespace costs.
func BenchmarkStart(b *testing.B) {
	for _, c := range []struct {
		name string
		off  bool
	}{{"userns", false}, {"hostids", true}} {
		b.Run(c.name, func(b *testing.B) {
			needRoot(b)
			rt, err := New(Config{CgroupParent: testCgroupParent, IDs: shim.IDConfig{Off: c.off}})
			if err != nil {
				b.Skipf("namespace runtime unavailable here: %v", err)
			}
			benchmarkStart(b, rt)
		})
	}
}

func benchmarkStart(b *testing.B, rt *Runtime) {
	root := newStateRoot(b)
	var rssTotal, pssTotal, memN int
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		id := fmt.Sprintf("bench-%d-%d", os.Getpid(), i)
		dir := filepath.Join(root, "sandboxes", id)
		if err := os.Mkdir(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		spec := runtime.Spec{ID: id, Dir: dir, LaunchID: "l" + id, Image: "host", Capability: []byte("cap-" + id)}
		b.StartTimer()
		pid, err := rt.Start(context.Background(), spec)
		if err != nil {
			b.Fatal(err)
		}
		var c *control.Client
		deadline := time.Now().Add(10 * time.Second)
		for {
			conn, err := net.Dial("unix", rt.ControlPath(dir))
			if err == nil {
				c, err = control.Dial(conn, spec.Capability, 5*time.Second)
				if err == nil {
					break
				}
			}
			if time.Now().After(deadline) || !pid.Alive() {
				b.Fatalf("no hello: %v", err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		b.StopTimer()
		if i < 5 {
			procs := []int{pid.Pid}
			if cg, err := platform.OpenCgroup(rt.cgroupName(id, spec.Dir)); err == nil {
				pids, _ := cg.Pids()
				procs = append(procs, pids...)
			}
			for _, p := range procs {
				rssTotal += rssKiB(p)
				pssTotal += pssKiB(p)
			}
			memN++
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.Shutdown(ctx, time.Second); err != nil {
			b.Fatal(err)
		}
		c.Close()
		if err := waitGone(ctx, pid); err != nil {
			b.Fatal(err)
		}
		if err := rt.Cleanup(ctx, id, dir, pid); err != nil {
			b.Fatal(err)
		}
		cancel()
		_ = os.RemoveAll(dir)
		b.StartTimer()
	}
	if memN > 0 {
		b.ReportMetric(float64(rssTotal)/float64(memN)/1024, "idle-rss-MiB")
		b.ReportMetric(float64(pssTotal)/float64(memN)/1024, "idle-pss-MiB")
	}
}

// BenchmarkBwrapBaseline spawns a bare bubblewrap sandbox running true: the floor Start is
// compared against.
func BenchmarkBwrapBaseline(b *testing.B) {
	needRoot(b)
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (apt-get install -y bubblewrap); skipping the baseline")
	}
	args := []string{"--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
		"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "true"}
	for b.Loop() {
		if out, err := exec.Command(bwrap, args...).CombinedOutput(); err != nil {
			b.Fatalf("bwrap: %v: %s", err, out)
		}
	}
}

// BenchmarkUnshareBaseline spawns true in new namespaces with util-linux's unshare.
func BenchmarkUnshareBaseline(b *testing.B) {
	needRoot(b)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		b.Skip("unshare is not installed")
	}
	for b.Loop() {
		if out, err := exec.Command(unshare, "-m", "-p", "-u", "-i", "-n", "-f", "--mount-proc", "true").CombinedOutput(); err != nil {
			b.Fatalf("unshare: %v: %s", err, out)
		}
	}
}

// BenchmarkExecTrue measures the round trip of running true in a sandbox through the control
// session: the agent's fork and exec under the sandbox's seccomp filter, cgroup and
// namespaces.
func BenchmarkExecTrue(b *testing.B) {
	rt := newTestRuntime(b)
	root := newStateRoot(b)
	s := startSandbox(b, rt, root, "execbench", runtime.Resources{})
	ctx := context.Background()
	for b.Loop() {
		p, err := s.client.Exec(ctx, control.ExecRequest{Argv: []string{"/bin/true"}, User: "user"})
		if err != nil {
			b.Fatal(err)
		}
		go func() { _, _ = io.Copy(io.Discard, p.Stderr) }()
		_, _ = io.Copy(io.Discard, p.Stdout)
		st, err := p.Wait()
		if err != nil || st.ExitCode != 0 {
			b.Fatalf("true: %+v, %v", st, err)
		}
	}
}
