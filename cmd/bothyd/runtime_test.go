package main

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRuntimeFlags: --user-namespaces defaults to true, takes BOTHY_USER_NAMESPACES as its
// default, and the flag wins over the environment; a malformed variable is an error. The
// server and `bothyd check` both parse these flags through addRuntimeFlags.
func TestRuntimeFlags(t *testing.T) {
	for _, c := range []struct {
		name, env string
		args      []string
		want      bool
		wantErr   bool
	}{
		{name: "default", want: true},
		{name: "flag off", args: []string{"--user-namespaces=false"}, want: false},
		{name: "env off", env: "false", want: false},
		{name: "env off, flag on", env: "0", args: []string{"--user-namespaces=true"}, want: true},
		{name: "env malformed", env: "maybe", wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("BOTHY_USER_NAMESPACES", c.env)
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o, err := addRuntimeFlags(fs)
			if c.wantErr {
				if err == nil {
					t.Fatalf("BOTHY_USER_NAMESPACES=%q: no error", c.env)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.Parse(append(c.args, "--runtime-binary", "self")); err != nil {
				t.Fatal(err)
			}
			if o.userNamespaces != c.want || o.binary != "self" {
				t.Fatalf("got %+v, want userNamespaces %t and binary self", *o, c.want)
			}
		})
	}
}

// TestCgroupParentFlag: --cgroup-parent, else BOTHY_CGROUP_PARENT, else bothy; the namespace
// runtime gets it (its identity hashes it, so the server and check agree).
func TestCgroupParentFlag(t *testing.T) {
	for _, c := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{name: "default", want: defaultCgroupParent},
		{name: "env", env: "system.slice/bothy-sandboxes.service", want: "system.slice/bothy-sandboxes.service"},
		{name: "flag over env", env: "a", args: []string{"--cgroup-parent", "b/c"}, want: "b/c"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("BOTHY_CGROUP_PARENT", c.env)
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o, err := addRuntimeFlags(fs)
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if o.cgroupParent != c.want {
				t.Fatalf("cgroupParent %q, want %q", o.cgroupParent, c.want)
			}
		})
	}
}

// TestParseOptionsRuntime: the server's command line carries the runtime's flags.
func TestParseOptionsRuntime(t *testing.T) {
	o, err := parseOptions([]string{"--user-namespaces=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.runtime == nil || o.runtime.userNamespaces {
		t.Fatalf("--user-namespaces=false parsed to %+v", o.runtime)
	}
}

// TestPruneRuntimes: pruning keeps the runtime in use, binaries younger than a provisioner's
// window and those a live process runs, and removes old unused binaries, the stamps that
// named them and old build directories of crashed provisioners.
func TestPruneRuntimes(t *testing.T) {
	bin := t.TempDir()
	now := time.Now()
	past := now.Add(-2 * provisionTimeout)
	write := func(name, content string, mtime time.Time) string {
		t.Helper()
		p := filepath.Join(bin, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rt := func(c byte) string { return runtimeBinaryName + "-" + strings.Repeat(string(c), 24) }
	keep := write(rt('a'), "current", past)
	write(rt('b'), "old, unused", past)
	write(rt('c'), "young, maybe a concurrent provisioner's", now)
	write("server-"+strings.Repeat("1", 24), rt('a')+"\n", past)
	write("server-"+strings.Repeat("2", 24), rt('b')+"\n", past)
	write("server-"+strings.Repeat("3", 24), rt('c')+"\n", past)
	oldBuild, youngBuild := filepath.Join(bin, ".build-1"), filepath.Join(bin, ".build-2")
	for _, d := range []string{oldBuild, youngBuild} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(oldBuild, past, past); err != nil {
		t.Fatal(err)
	}
	// A copy of sleep(1) as an old runtime binary, running: one a live process runs.
	sleep, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Skip("no /bin/sleep to run as a runtime binary in use")
	}
	inUse := write(rt('d'), string(sleep), past)
	cmd := exec.Command(inUse, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !runningExecutables()[inUse] {
		t.Fatalf("runningExecutables does not list %s, which pid %d runs", inUse, cmd.Process.Pid)
	}
	pruneRuntimes(bin, keep, now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var left []string
	entries, err := os.ReadDir(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := []string{".build-2", "bothyd-runtime-" + strings.Repeat("a", 24), "bothyd-runtime-" + strings.Repeat("c", 24),
		"bothyd-runtime-" + strings.Repeat("d", 24),
		"server-" + strings.Repeat("1", 24), "server-" + strings.Repeat("3", 24)}
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Fatalf("left after pruning:\n %v\nwant\n %v", left, want)
	}
}

// TestRuntimeBuiltWithCgo: a runtime binary built with cgo is told from one built without,
// and a file that is no Go binary says nothing.
func TestRuntimeBuiltWithCgo(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no C compiler: cgo cannot be enabled here")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport \"net\"\n\nfunc main() { _, _ = net.Listen(\"tcp\", \"\") }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cgo := range []string{"0", "1"} {
		out := filepath.Join(dir, "runtime-cgo-"+cgo)
		build := exec.Command("go", "build", "-o", out, src)
		build.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build with CGO_ENABLED=%s: %v\n%s", cgo, err, b)
		}
		if got := runtimeBuiltWithCgo(out); got != (cgo == "1") {
			t.Errorf("runtimeBuiltWithCgo of a CGO_ENABLED=%s build = %v", cgo, got)
		}
	}
	if runtimeBuiltWithCgo(src) {
		t.Error("a source file was taken for a cgo build")
	}
}

// TestSettleCgroupParent: --cgroup-parent, else BOTHY_CGROUP_PARENT, else the parent the
// state root records, else bothy; a record that is a link is refused.
func TestSettleCgroupParent(t *testing.T) {
	for _, c := range []struct {
		name, env, recorded string
		args                []string
		want, from          string
	}{
		{name: "default", want: defaultCgroupParent},
		{name: "recorded", recorded: "r", want: "r", from: "record"},
		{name: "env over record", env: "e", recorded: "r", want: "e", from: "BOTHY_CGROUP_PARENT"},
		{name: "flag over env and record", env: "e", recorded: "r", args: []string{"--cgroup-parent", "f"}, want: "f", from: "--cgroup-parent"},
		{name: "flag equal to the default over record", recorded: "r", args: []string{"--cgroup-parent", defaultCgroupParent}, want: defaultCgroupParent, from: "--cgroup-parent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("BOTHY_CGROUP_PARENT", c.env)
			}
			root := t.TempDir()
			if c.recorded != "" {
				o := &runtimeOptions{cgroupParent: c.recorded}
				if err := recordCgroupParent(root, o, "", slog.New(slog.DiscardHandler)); err != nil {
					t.Fatal(err)
				}
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o, err := addRuntimeFlags(fs)
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			o.noteCgroupParentSource(fs)
			recorded, err := settleCgroupParent(o, root)
			if err != nil {
				t.Fatal(err)
			}
			if recorded != c.recorded || o.cgroupParent != c.want {
				t.Fatalf("recorded %q, cgroupParent %q; want %q, %q", recorded, o.cgroupParent, c.recorded, c.want)
			}
			if from := o.cgroupParentFrom; (c.from == "record") != strings.HasSuffix(from, cgroupParentName) || (c.from != "record" && from != c.from) {
				t.Fatalf("cgroupParentFrom %q, want %s", from, c.from)
			}
		})
	}
	t.Run("link", func(t *testing.T) {
		root := t.TempDir()
		target := filepath.Join(t.TempDir(), "elsewhere.json")
		if err := os.WriteFile(target, []byte(`{"format": 1, "parent": "elsewhere"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, cgroupParentName)); err != nil {
			t.Fatal(err)
		}
		if p, err := readCgroupParent(root); err == nil {
			t.Fatalf("a record that is a link read as %q", p)
		}
		o := &runtimeOptions{cgroupParent: "new"}
		if err := recordCgroupParent(root, o, "", slog.New(slog.DiscardHandler)); err == nil {
			t.Fatal("a record that is a link was replaced")
		}
	})
}
