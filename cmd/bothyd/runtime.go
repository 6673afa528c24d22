package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/microvm"
	"github.com/bothy/bothy/runtime/namespace"
)

// runtimeBinaryName is the binary of the sandbox side (cmd/bothyd-runtime).
const runtimeBinaryName = "bothyd-runtime"

// packagedRuntime is where the .deb and .rpm packages install the runtime binary
// (packaging/nfpm.yaml). A variable, so that a test can point it elsewhere.
var packagedRuntime = "/usr/libexec/bothy/" + runtimeBinaryName

// runtimeSelf, given as the runtime binary, makes sandboxes run bothyd itself.
const runtimeSelf = "self"

// runtimeBinDir is the directory of the state root where bothyd keeps the runtime binaries
// it built itself (see provisionRuntime).
const runtimeBinDir = "bin"

// provisionTimeout bounds the Go toolchain's work at start-up: a cold build cache compiles
// the runtime's packages in about 15 s on a slow 2-core host.
const provisionTimeout = 5 * time.Minute

// runtimeOptions are the flags that configure the sandbox runtime. The server and
// `bothyd check` both take them (addRuntimeFlags) and build the runtime from them alone
// (newRuntime), so that the two can never be configured apart.
type runtimeOptions struct {
	// binary is --runtime-binary (see runtimeExecutable).
	binary string
	// userNamespaces is --user-namespaces: false runs sandboxes with the host's ids
	// (namespace.Config.IDs.Off).
	userNamespaces bool
	// runtimes is --runtimes, the kinds that take new sandboxes ("" for each that works here).
	runtimes string
	// microvmAccel is --microvm-accel, how the microvm runtime chooses its accelerator.
	microvmAccel string
	// cgroupParent is --cgroup-parent, the cgroup below which sandboxes' cgroups, and on
	// cgroup v2 the runtime processes' leaf, live (namespace.Config.CgroupParent).
	cgroupParent string
	// cgroupParentFrom says where cgroupParent came from, for messages: "--cgroup-parent",
	// "BOTHY_CGROUP_PARENT", the state root's record (settleCgroupParent), or "" for the
	// default.
	cgroupParentFrom string
}

// defaultCgroupParent is --cgroup-parent's default, a cgroup of bothyd's own below the
// hierarchy's root (namespace.Config.CgroupParent's default too).
const defaultCgroupParent = "bothy"

// userNamespacesFlag is the flag that turns sandboxes' user namespaces off; start errors of a
// state root that cannot be idmapped name it.
const userNamespacesFlag = "user-namespaces"

// addRuntimeFlags defines the runtime's flags on fs, each defaulting to its environment
// variable, and returns where they land once fs is parsed.
func addRuntimeFlags(fs *flag.FlagSet) (*runtimeOptions, error) {
	o := &runtimeOptions{}
	fs.StringVar(&o.binary, "runtime-binary", os.Getenv("BOTHY_RUNTIME_BINARY"), "the bothyd-runtime binary that sandboxes run (env BOTHY_RUNTIME_BINARY); default: bothyd-runtime beside bothyd if there is one, else /usr/libexec/bothy/bothyd-runtime if there is one, else one built from bothyd's source tree into <root>/bin, else bothyd itself; self: bothyd itself")
	userns, err := envParsed("BOTHY_USER_NAMESPACES", true, strconv.ParseBool)
	if err != nil {
		return nil, err
	}
	fs.StringVar(&o.runtimes, "runtimes", os.Getenv("BOTHY_RUNTIMES"), "the runtimes that take new sandboxes, comma-separated: namespace, microvm (env BOTHY_RUNTIMES); default: each that works on this host")
	fs.StringVar(&o.microvmAccel, "microvm-accel", envOr("BOTHY_MICROVM_ACCEL", microvm.AccelAuto), "how microVMs are accelerated: auto, kvm or tcg (env BOTHY_MICROVM_ACCEL); auto boots a probe guest under KVM once at start-up, in the background, and takes kvm if it answers within 10 s, else tcg (a QEMU that fails under KVM answers at once; a guest that KVM stalls costs the 10 s); kvm and tcg skip the probe (kvm: the microvm runtime is unavailable where /dev/kvm does not open)")
	fs.StringVar(&o.cgroupParent, "cgroup-parent", envOr("BOTHY_CGROUP_PARENT", defaultCgroupParent), "the cgroup, relative to the cgroup hierarchy's root, below which each sandbox gets a cgroup <parent>/<id>.<hash> and, on cgroup v2, the processes that outlive bothyd start in <parent>/runtime (env BOTHY_CGROUP_PARENT); under systemd, a cgroup delegated to the sandboxes' own unit (system.slice/bothy-sandboxes.service), so that a restart of bothyd's unit kills no sandbox. Given neither, the parent that the state root records (<root>/cgroup.json, written by bothyd at start) is taken, else bothy; bothyd refuses another parent than the recorded one while sandboxes' cgroups remain below that")
	fs.BoolVar(&o.userNamespaces, userNamespacesFlag, userns, "run each sandbox in a user namespace with host ids of its own (env BOTHY_USER_NAMESPACES); false: sandboxes run with the host's ids (root inside is host root for per-user kernel limits), for a state root or images on a file system that cannot be idmapped (overlayfs, NFS)")
	return o, nil
}

// forceFallbacksEnv, set to true, makes the namespace runtime's start-up probes take each
// feature's fallback wherever it works (namespace.Config.ForceFallbacks). It is for tests
// alone, and so an environment variable rather than a flag that --help would offer.
const forceFallbacksEnv = "BOTHY_TEST_FORCE_FALLBACKS"

// releaseSocketName is the socket in the state root where the server takes the releases of
// sandboxes' ends from their shims (namespace.Runtime.ServeReleases).
const releaseSocketName = "release.sock"

// newRuntime returns the runtime as the server configures it, running the runtime binary
// that runtimeExecutable chooses for o.binary and the state root, and that executable.
// `bothyd check` makes its runtime here too: a runtime's identity hashes its executable and
// configuration, so a checker configured otherwise than the server would take every running
// sandbox for one of another runtime.
func newRuntime(o runtimeOptions, root string, log *slog.Logger) (*namespace.Runtime, string, error) {
	exe, err := runtimeExecutable(o.binary, root, log)
	if err != nil {
		return nil, "", err
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, "", err
	}
	cfg := namespace.Config{Executable: exe, ReleaseSocket: filepath.Join(abs, releaseSocketName), CgroupParent: o.cgroupParent, StateRoot: abs}
	cfg.IDs.Off = !o.userNamespaces
	// For tests only: the probes take every fallback, so that a host whose kernel has
	// everything runs the paths that older kernels take (docs/install.md).
	if v, err := envParsed(forceFallbacksEnv, false, strconv.ParseBool); err != nil {
		return nil, "", err
	} else if v {
		cfg.ForceFallbacks = true
		log.Warn("the kernel probes' fallbacks are forced (" + forceFallbacksEnv + "), for a test; never set it in production")
	}
	rt, err := namespace.New(cfg)
	if err != nil {
		return nil, "", err
	}
	return rt, exe, nil
}

// runtimeExecutable chooses what sandboxes run as their shim, init and agent, in this order:
//
//  1. the binary given, or this executable itself if that is "self" (the single-binary mode,
//     for a host that should run no toolchain);
//  2. bothyd-runtime beside this executable (`make build`, the container image);
//  3. the packages' /usr/libexec/bothy/bothyd-runtime (packagedRuntime), which is not on
//     the PATH beside /usr/bin/bothyd, since no one runs it by hand;
//  4. the bothyd-runtime that bothyd built from its own source tree into the state root
//     (provisionRuntime: `go run ./cmd/bothyd`, or a `go build` binary next to its source);
//  5. this executable itself ("" lets the runtime use /proc/self/exe): one binary is enough.
//
// The small binary starts sandboxes several milliseconds faster per process, since the
// server's binary runs the package initialisers of the HTTP stack, the request validator and
// the metrics in each of a start's processes. Because it runs as root, a runtime binary must
// belong to the user bothyd runs as (or root) and be writable by no one else.
func runtimeExecutable(given, root string, log *slog.Logger) (string, error) {
	if given == runtimeSelf {
		return "", nil
	}
	if given != "" {
		abs, err := filepath.Abs(given)
		if err != nil {
			return "", err
		}
		if err := checkRuntimeBinary(abs); err != nil {
			return "", err
		}
		warnIfCgo(abs, log)
		return abs, nil
	}
	var installed []string
	if self, err := os.Executable(); err == nil {
		installed = append(installed, filepath.Join(filepath.Dir(self), runtimeBinaryName))
	}
	for _, exe := range append(installed, packagedRuntime) {
		if _, err := os.Lstat(exe); !errors.Is(err, os.ErrNotExist) {
			if err := checkRuntimeBinary(exe); err != nil {
				return "", err
			}
			warnIfCgo(exe, log)
			return exe, nil
		}
	}
	exe, err := provisionRuntime(root, log)
	if errors.Is(err, errNoRoot) {
		return "", nil // no sandbox starts without root, so no start is slow either
	}
	if err != nil {
		log.Warn("sandboxes run bothyd itself, which starts them slower than bothyd-runtime would; build it beside bothyd (make build) to avoid this",
			"reason", err)
		return "", nil
	}
	return exe, nil
}

// errNoRoot is why a server without root privileges provisions no runtime: it starts no
// sandboxes.
var errNoRoot = errors.New("bothyd runs without root")

// provisionRuntime returns the bothyd-runtime built from the very source tree this bothyd
// was built from, building it into <root>/bin on the first start of this build:
//
//   - <root>/bin/server-<sha256 of this executable> names the runtime verified for this
//     build; a later start of the same build reads it and runs no toolchain.
//   - <root>/bin/bothyd-runtime-<sha256 of its content> is a runtime binary. It is named by
//     its content, written once and never replaced, so a server that runs it while another
//     build provisions its own never sees the file change, and server builds that differ only
//     on the server side share one runtime binary and so one runtime identity: their running
//     sandboxes stay reattachable across such a rebuild.
//
// The runtime is trusted to be this server's sandbox side only after the same toolchain, in
// the same environment and with the build settings recorded in this executable, reproduces
// this executable byte for byte from the source tree (as `go run` builds it, else as
// `go build` does) after building the runtime from it: a tree edited since this server was
// built, another toolchain, or a setting that cannot be reproduced fails the comparison, and
// bothyd then runs itself. Concurrent provisioners (the server and `bothyd check`) are
// safe: every file appears by a rename, complete.
func provisionRuntime(root string, log *slog.Logger) (string, error) {
	if os.Geteuid() != 0 {
		return "", errNoRoot
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(absRoot); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("no state root %s to keep a runtime binary in", root)
	}
	selfSum, err := platform.FileSHA256("/proc/self/exe")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(absRoot, runtimeBinDir)
	stamp := filepath.Join(bin, "server-"+selfSum[:24])
	if exe, err := stampedRuntime(bin, stamp); err == nil {
		return exe, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	b, err := newBuilder()
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(bin, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	tmp, err := os.MkdirTemp(bin, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), provisionTimeout)
	defer cancel()
	log.Info("building bothyd-runtime from the source tree, once for this build of bothyd", "source", b.src, "into", bin)
	t0 := time.Now()
	built := filepath.Join(tmp, runtimeBinaryName)
	if err := b.buildRuntime(ctx, built); err != nil {
		return "", err
	}
	if err := b.reproduces(ctx, tmp, selfSum); err != nil {
		return "", err
	}
	sum, err := platform.FileSHA256(built)
	if err != nil {
		return "", err
	}
	name := runtimeBinaryName + "-" + sum[:24]
	exe := filepath.Join(bin, name)
	if _, err := os.Lstat(exe); errors.Is(err, os.ErrNotExist) {
		if err := os.Chmod(built, 0o755); err != nil {
			return "", err
		}
		if err := os.Rename(built, exe); err != nil {
			return "", err
		}
	}
	if err := writeFileAtomic(tmp, stamp, []byte(name+"\n")); err != nil {
		return "", err
	}
	log.Info("built bothyd-runtime", "executable", exe, "took", time.Since(t0).Round(time.Millisecond))
	if err := checkRuntimeBinary(exe); err != nil {
		return "", err
	}
	pruneRuntimes(bin, exe, time.Now(), log)
	return exe, nil
}

// pruneRuntimes removes from bin what no server needs any more (after a build, the one time
// something new appears there; a restart of the same build scans nothing), so that the edit-and-`go run`
// loop does not leave a 6 MB binary per sandbox-side change behind: runtime binaries other
// than keep that no live process runs, the stamps that name a binary no longer there, and
// the build directories of provisioners that crashed. Whatever is younger than
// provisionTimeout is left alone, since a concurrent provisioner (a `bothyd check`, a server
// of another build) may have renamed its binary in without having written its stamp yet, or
// still be building. A server of an older build that starts again later finds its stamp's
// binary gone and builds it again; sandboxes still running an old binary keep it, as it is
// the executable of their processes. Failures are logged and change nothing else.
func pruneRuntimes(bin, keep string, now time.Time, log *slog.Logger) {
	entries, err := os.ReadDir(bin)
	if err != nil {
		log.Warn("cannot list the runtime binaries to prune them", "dir", bin, "error", err)
		return
	}
	running := runningExecutables()
	old := func(e os.DirEntry) bool {
		fi, err := e.Info()
		return err == nil && now.Sub(fi.ModTime()) > provisionTimeout
	}
	remove := func(name string) {
		if err := os.RemoveAll(filepath.Join(bin, name)); err != nil {
			log.Warn("cannot prune a runtime binary", "file", name, "error", err)
		}
	}
	var stamps []string
	for _, e := range entries {
		name := e.Name()
		full := filepath.Join(bin, name)
		switch {
		case strings.HasPrefix(name, "server-"):
			stamps = append(stamps, name)
		case runtimeName.MatchString(name) && full != keep && !running[full] && old(e):
			remove(name)
		case strings.HasPrefix(name, ".build-") && e.IsDir() && old(e):
			remove(name)
		}
	}
	for _, name := range stamps {
		if _, err := stampedRuntime(bin, filepath.Join(bin, name)); errors.Is(err, os.ErrNotExist) {
			remove(name)
		}
	}
}

// runningExecutables is the set of the executables of this pid namespace's processes, as
// /proc names them (a file deleted since reads "... (deleted)" and so matches no path).
func runningExecutables() map[string]bool {
	running := map[string]bool{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe")); err == nil {
			running[exe] = true
		}
	}
	return running
}

// runtimeName is the name of a provisioned runtime binary in <root>/bin.
var runtimeName = regexp.MustCompile(`^` + runtimeBinaryName + `-[0-9a-f]{24}$`)

// stampedRuntime is the runtime binary that stamp names, or an error wrapping
// os.ErrNotExist when there is no stamp.
func stampedRuntime(bin, stamp string) (string, error) {
	b, err := os.ReadFile(stamp)
	if err != nil {
		return "", err
	}
	name := strings.TrimSpace(string(b))
	if !runtimeName.MatchString(name) {
		return "", fmt.Errorf("%s names no runtime binary: %q", stamp, name)
	}
	exe := filepath.Join(bin, name)
	return exe, checkRuntimeBinary(exe)
}

// builder runs the Go toolchain on this executable's source tree with its recorded build
// settings.
type builder struct {
	goTool string
	// src is the main module's directory; mainPkg and runtimePkg the import paths of
	// cmd/bothyd and cmd/bothyd-runtime.
	src, mainPkg, runtimePkg string
	// flags and env are this executable's build settings, as command-line flags and
	// environment variables.
	flags, env []string
}

func newBuilder() (*builder, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return nil, errors.New("this executable records no build information")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("no Go toolchain to build bothyd-runtime with: %w", err)
	}
	src, err := moduleDir(info.Main.Path)
	if err != nil {
		return nil, err
	}
	b := &builder{goTool: goTool, src: src, mainPkg: info.Path,
		runtimePkg: path.Join(path.Dir(info.Path), runtimeBinaryName)}
	vcs := false
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs":
			vcs = true
		case s.Key == "-buildmode" && s.Value == "exe", s.Key == "-compiler" && s.Value == "gc":
			// The defaults, recorded always; given explicitly, -buildmode=exe builds
			// another binary than the default does, so they are left to default.
		case strings.HasPrefix(s.Key, "-"):
			b.flags = append(b.flags, s.Key+"="+s.Value)
		case strings.HasPrefix(s.Key, "CGO_") || strings.HasPrefix(s.Key, "GO"):
			b.env = append(b.env, s.Key+"="+s.Value)
		}
	}
	b.flags = append(b.flags, fmt.Sprintf("-buildvcs=%t", vcs))
	return b, nil
}

// moduleDir is the directory of the main module whose path is module: the one holding the
// source file this function was compiled from (recorded unless the build used -trimpath).
func moduleDir(module string) (string, error) {
	_, file, _, ok := goruntime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", errors.New("this executable records no source tree (built with -trimpath)")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if declaresModule(filepath.Join(dir, "go.mod"), module) {
			return dir, nil
		}
		if dir == filepath.Dir(dir) {
			return "", fmt.Errorf("the source tree of this executable (%s) is not here", filepath.Dir(file))
		}
	}
}

// declaresModule says whether the go.mod file at name declares the module path.
func declaresModule(name, module string) bool {
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == module
		}
	}
	return false
}

// buildRuntime builds cmd/bothyd-runtime to out without cgo, as `make build` and the
// container image do, so that the agent drops its privileges without a re-exec.
func (b *builder) buildRuntime(ctx context.Context, out string) error {
	args := []string{"build", "-o", out}
	for _, f := range b.flags {
		if strings.HasPrefix(f, "-tags=") || strings.HasPrefix(f, "-trimpath=") || strings.HasPrefix(f, "-buildvcs=") {
			args = append(args, f)
		}
	}
	_, err := b.run(ctx, append(args, b.runtimePkg), "CGO_ENABLED=0")
	return err
}

// reproduces checks that the source tree builds this very executable, whose SHA-256 is want:
// as `go run` builds it (which strips the debug information without recording so, and keeps
// the result in the build cache, so this costs a cache lookup), else as `go build` does.
func (b *builder) reproduces(ctx context.Context, tmp, want string) error {
	if sha, err := exec.LookPath("sha256sum"); err == nil {
		args := append(append([]string{"run", "-exec", sha}, b.flags...), b.mainPkg)
		if out, err := b.run(ctx, args); err == nil {
			if f := strings.Fields(string(out)); len(f) > 0 && f[0] == want {
				return nil
			}
		}
	}
	out := filepath.Join(tmp, "bothyd")
	args := append(append([]string{"build", "-o", out}, b.flags...), b.mainPkg)
	if _, err := b.run(ctx, args); err != nil {
		return err
	}
	got, err := platform.FileSHA256(out)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("the source tree %s does not build this executable (it changed since, or the toolchain or the build settings differ)", b.src)
	}
	return nil
}

// run runs the go command in the source tree with the recorded environment, then extra, and
// returns its standard output.
func (b *builder) run(ctx context.Context, args []string, extra ...string) ([]byte, error) {
	// The go tool found beside the running toolchain, with arguments this file builds: no
	// input of a client's reaches the command line (gosec G702).
	cmd := exec.CommandContext(ctx, b.goTool, args...) //nolint:gosec // see above
	cmd.Dir = b.src
	cmd.Env = append(append(os.Environ(), b.env...), extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", args[0], err, strings.TrimSpace(lastLines(stderr.String(), 5)))
	}
	return stdout.Bytes(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// writeFileAtomic writes data to name by a rename from a file in tmp (on the same file
// system), so that a reader sees either no file or the whole of it.
func writeFileAtomic(tmp, name string, data []byte) error {
	f, err := os.CreateTemp(tmp, "stamp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}

// warnIfCgo warns when the runtime binary at path was built with cgo (a plain `go build` on
// a host with a C compiler: the net package then links it). Such a binary cannot change the
// privileges of all its threads at once, so every sandbox's init drops them on one thread
// and executes itself a second time: on the CI host a start took 25.6 instead of 18.2 ms and
// a lifecycle cycle 44 instead of 34 ms of CPU (docs/performance.md).
func warnIfCgo(path string, log *slog.Logger) {
	if runtimeBuiltWithCgo(path) {
		log.Warn("the runtime binary was built with cgo, which makes every sandbox start slower; build it with CGO_ENABLED=0 (make build does)",
			"binary", path)
	}
}

// runtimeBuiltWithCgo reports whether the Go binary at path says it was built with cgo
// enabled; a binary that is not a Go binary, or whose build information cannot be read,
// says nothing.
func runtimeBuiltWithCgo(path string) bool {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "CGO_ENABLED" {
			return s.Value == "1"
		}
	}
	return false
}

func checkRuntimeBinary(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("the runtime binary: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("the runtime binary %s is not a regular file", path)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("the runtime binary %s is not executable", path)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("the runtime binary %s is writable by others; chmod go-w it", path)
	case ok && int(st.Uid) != os.Geteuid() && st.Uid != 0:
		return fmt.Errorf("the runtime binary %s belongs to another user", path)
	}
	return nil
}
