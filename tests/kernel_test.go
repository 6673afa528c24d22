package tests

import (
	"strings"
	"testing"
)

// nsRuntimeJSON is one of /v1/info's runtimes, with the namespace runtime's mechanisms.
type nsRuntimeJSON struct {
	Kind       string `json:"kind"`
	State      string `json:"state"`
	Reason     string `json:"reason"`
	Mechanisms *struct {
		Kernel         string `json:"kernel"`
		OverlayLayers  string `json:"overlay_layers"`
		TmpfsOwnership string `json:"tmpfs_ownership"`
		UserNamespaces bool   `json:"user_namespaces"`
		Forced         bool   `json:"forced"`
	} `json:"mechanisms"`
}

// runtimeStatus is the runtime kind as /v1/info shows it.
func (d *daemon) runtimeStatus(kind string) nsRuntimeJSON {
	d.t.Helper()
	info := decode[struct {
		Runtimes []nsRuntimeJSON `json:"runtimes"`
	}](d.t, d.doJSON("GET", "/v1/info", nil), 200)
	for _, r := range info.Runtimes {
		if r.Kind == kind {
			return r
		}
	}
	d.t.Fatalf("/v1/info lists no runtime %q: %+v", kind, info.Runtimes)
	return nsRuntimeJSON{}
}

// TestKernelFallbacks: bothyd with the fallbacks of older kernels forced
// (BOTHY_TEST_FORCE_FALLBACKS, for tests only) says so in /v1/info and its log, and runs
// sandboxes with them, in a user namespace (the host files' tmpfs chowned, not idmapped:
// /etc and /etc/hostname are root's inside, as they are with an idmapped mount) and without
// one; a default bothyd on this host takes the best mechanisms.
func TestKernelFallbacks(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withEnv("BOTHY_TEST_FORCE_FALLBACKS=1"))
	st := d.runtimeStatus("namespace")
	if m := st.Mechanisms; st.State != "ready" || m == nil || m.OverlayLayers != "paths" || m.TmpfsOwnership != "chowned" || !m.UserNamespaces || !m.Forced || m.Kernel == "" {
		t.Fatalf("/v1/info shows the namespace runtime as %+v %+v", st, st.Mechanisms)
	}
	if !strings.Contains(d.logs.String(), `"overlay_layers":"paths"`) {
		t.Fatalf("the log does not say which mechanisms were chosen:\n%s", d.logs.String())
	}
	check := func(id string, userns bool) {
		t.Helper()
		d.create(id, true)
		if m := d.uidMap(id); (m == hostUIDMap) == userns {
			t.Fatalf("sandbox %s's uid map is %q (user namespace wanted: %t)", id, m, userns)
		}
		got := d.exec(id, map[string]any{"command": []string{"sh", "-c",
			"stat -c '%n %u:%g' /etc /etc/hostname /etc/passwd /home/user && echo hi > /home/user/f && stat -c '%u' /home/user/f && cat /etc/hostname"}})
		// An exec runs as user (1000) unless it names another.
		want := "/etc 0:0\n/etc/hostname 0:0\n/etc/passwd 0:0\n/home/user 1000:1000\n1000\n" + id + "\n"
		if got.ExitCode != 0 || got.Stdout != want {
			t.Fatalf("in sandbox %s: %+v\nwant stdout:\n%s", id, got, want)
		}
	}
	check("with-userns", true)

	d.Args = append(d.Args, "--user-namespaces=false")
	d.Restart(false)
	st = d.runtimeStatus("namespace")
	if m := st.Mechanisms; st.State != "ready" || m == nil || m.OverlayLayers != "paths" || m.TmpfsOwnership != "" || m.UserNamespaces || !m.Forced {
		t.Fatalf("without user namespaces /v1/info shows %+v %+v", st, st.Mechanisms)
	}
	check("without-userns", false)

	best := startDaemon(t)
	if m := best.runtimeStatus("namespace").Mechanisms; m == nil || m.Forced || m.OverlayLayers == "" {
		t.Fatalf("a default bothyd shows the mechanisms %+v", m)
	}
}
