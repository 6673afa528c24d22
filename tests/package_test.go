package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// packagedFile is one entry of a package: its mode as ls shows it, owner and group.
type packagedFile struct {
	mode, owner, group string
}

// wantPackaged is every file and directory the packages own that bothy put there (the
// parents both formats list, /usr and the like, aside).
var wantPackaged = map[string]packagedFile{
	"/usr/bin/bothyd":                                 {"-rwxr-xr-x", "root", "root"},
	"/usr/bin/bothy":                                  {"-rwxr-xr-x", "root", "root"},
	"/usr/libexec/bothy":                              {"drwxr-xr-x", "root", "root"},
	"/usr/libexec/bothy/bothyd-runtime":               {"-rwxr-xr-x", "root", "root"},
	"/usr/lib/systemd/system/bothyd.service":          {"-rw-r--r--", "root", "root"},
	"/usr/lib/systemd/system/bothy-sandboxes.service": {"-rw-r--r--", "root", "root"},
	"/etc/bothy":                                      {"drwxr-xr-x", "root", "root"},
	"/etc/bothy/bothyd.env":                           {"-rw-r--r--", "root", "root"},
	// The token's group may pass through the state root, not list it; others get nothing.
	"/var/lib/bothy": {"drwx--x---", "root", "bothy"},
}

// sharedDirs are the system's directories that a .deb lists as the parents of its files.
var sharedDirs = []string{"/etc", "/usr", "/usr/bin", "/usr/lib", "/usr/lib/systemd", "/usr/lib/systemd/system", "/usr/libexec", "/var", "/var/lib"}

// TestPackages builds the .deb and the .rpm with scripts/package and checks what they hold:
// every file with its mode and owner and nothing else, the configuration file marked as one,
// the maintainer scripts (present, executable, valid shell), binaries that report the
// package's version, and a second build of the same tree giving the same .deb byte for byte.
func TestPackages(t *testing.T) {
	for _, tool := range []string{"dpkg-deb", "git", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s here: %v", tool, err)
		}
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	formats := []string{"deb"}
	_, rpmErr := exec.LookPath("rpm")
	if rpmErr == nil {
		formats = append(formats, "rpm")
	}
	pkgs := buildPackages(t, repo, dist, formats...)
	deb := pkgs["deb"]

	// Contents: dpkg-deb -c prints "drwx--x--- root/bothy 0 2026-12-06 19:55 ./var/lib/bothy/".
	got := map[string]packagedFile{}
	for _, line := range strings.Split(strings.TrimSpace(output(t, "dpkg-deb", "-c", deb)), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb -c line %q", line)
		}
		owner, group, _ := strings.Cut(f[1], "/")
		path := strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")
		got[path] = packagedFile{f[0], owner, group}
	}
	checkPackaged(t, "deb", got, true)

	fields := output(t, "dpkg-deb", "-f", deb, "Package", "Version", "Architecture")
	m := regexp.MustCompile(`(?m)^Version: (\S+)-1$`).FindStringSubmatch(fields)
	if !strings.Contains(fields, "Package: bothy\n") || m == nil {
		t.Fatalf("control fields:\n%s", fields)
	}
	version := m[1]
	ctrl := t.TempDir()
	output(t, "dpkg-deb", "-e", deb, ctrl)
	if b, err := os.ReadFile(filepath.Join(ctrl, "conffiles")); err != nil || strings.TrimSpace(string(b)) != "/etc/bothy/bothyd.env" {
		t.Fatalf("conffiles: %q, %v; want /etc/bothy/bothyd.env alone", b, err)
	}
	for _, s := range []string{"preinst", "postinst", "prerm", "postrm"} {
		checkScript(t, filepath.Join(ctrl, s))
	}

	// The binaries report the package's version: bothy's client version here; bothyd's is
	// the same -X main.version (scripts/package sets both).
	root := t.TempDir()
	output(t, "dpkg-deb", "-x", deb, root)
	out, _ := exec.Command(filepath.Join(root, "usr/bin/bothy"), "version", "--url", "http://127.0.0.1:1").CombinedOutput()
	if !strings.Contains(string(out), "Client: "+version) {
		t.Fatalf("bothy version says %q; want the package's version %s", out, version)
	}
	if b, err := os.ReadFile(filepath.Join(root, "usr/bin/bothyd")); err != nil || !strings.Contains(string(b), version) {
		t.Fatalf("bothyd does not carry the package's version %s (%v)", version, err)
	}
	if env, err := os.ReadFile(filepath.Join(root, "etc/bothy/bothyd.env")); err != nil ||
		!strings.Contains(string(env), "#BOTHY_CGROUP_PARENT=system.slice/bothy-sandboxes.service") {
		t.Fatalf("bothyd.env lacks the cgroup parent's default (%v):\n%s", err, env)
	}

	verifyUnits(t, root)

	// The same tree, built again, gives the same .deb.
	again := buildPackages(t, repo, t.TempDir(), "deb")["deb"]
	if a, b := fileSum(t, deb), fileSum(t, again); a != b {
		t.Fatalf("two builds of one tree differ: %s and %s", a, b)
	}

	if rpmErr != nil {
		t.Logf("no rpm here (%v): the .rpm is not checked; apt-get install rpm", rpmErr)
		return
	}
	rpmFile := pkgs["rpm"]
	// rpm -qlvp prints "drwx--x---    2 root     bothy    0 Dec  6 19:55 /var/lib/bothy".
	got = map[string]packagedFile{}
	for _, line := range strings.Split(strings.TrimSpace(output(t, "rpm", "-qlvp", rpmFile)), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 {
			t.Fatalf("rpm -qlvp line %q", line)
		}
		got[f[len(f)-1]] = packagedFile{f[0], f[2], f[3]}
	}
	checkPackaged(t, "rpm", got, false)
	if v := output(t, "rpm", "-qp", "--qf", "%{VERSION}", rpmFile); v != version {
		t.Fatalf("rpm version %q, deb version %q", v, version)
	}
	flags := output(t, "rpm", "-qp", "--qf", `[%{FILENAMES} %{FILEFLAGS:fflags}\n]`, rpmFile)
	if !strings.Contains(flags, "/etc/bothy/bothyd.env cn") {
		t.Fatalf("bothyd.env is not %%config(noreplace):\n%s", flags)
	}
	scripts := output(t, "rpm", "-qp", "--scripts", rpmFile)
	for _, s := range []string{"preinstall scriptlet", "postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet", "groupadd --system bothy", "try-restart bothyd.service"} {
		if !strings.Contains(scripts, s) {
			t.Errorf("rpm scripts lack %q:\n%s", s, scripts)
		}
	}
}

// verifyUnits runs systemd-analyze verify on the packaged units, as extracted into root, and
// fails on anything it says (it exits 0 on a setting it ignores, such as a misspelled value).
// The units' absolute paths are rewritten into root, where their binary is.
func verifyUnits(t *testing.T, root string) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Logf("no systemd-analyze here (%v): the units are not verified", err)
		return
	}
	dir := t.TempDir()
	var units []string
	for _, name := range []string{"bothy-sandboxes.service", "bothyd.service"} {
		b, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system", name))
		if err != nil {
			t.Fatal(err)
		}
		unit := strings.NewReplacer("=/usr/bin/", "="+root+"/usr/bin/", "=-/etc/bothy/", "=-"+root+"/etc/bothy/").Replace(string(b))
		units = append(units, filepath.Join(dir, name))
		if err := os.WriteFile(units[len(units)-1], []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// buildPackages runs scripts/package for formats into dist and returns each package's path.
func buildPackages(t *testing.T, repo, dist string, formats ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(filepath.Join(repo, "scripts/package"), formats...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "DIST="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/package: %v\n%s", err, out)
	}
	pkgs := map[string]string{}
	for _, f := range formats {
		m, _ := filepath.Glob(filepath.Join(dist, "bothy*."+f))
		if len(m) != 1 {
			t.Fatalf("scripts/package made %d .%s files: %v", len(m), f, m)
		}
		pkgs[f] = m[0]
	}
	return pkgs
}

func checkPackaged(t *testing.T, format string, got map[string]packagedFile, listsParents bool) {
	t.Helper()
	for path, want := range wantPackaged {
		if g, ok := got[path]; !ok {
			t.Errorf("%s: no %s", format, path)
		} else if g != want {
			t.Errorf("%s: %s is %v, want %v", format, path, g, want)
		}
	}
	for path := range got {
		_, known := wantPackaged[path]
		if !known && !(listsParents && (path == "" || slices.Contains(sharedDirs, path))) {
			t.Errorf("%s: unexpected %s", format, path)
		}
	}
}

func checkScript(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("maintainer script: %v", err)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("%s is not executable", path)
	}
	if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
		t.Errorf("%s: %v\n%s", path, err, out)
	}
}

func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
