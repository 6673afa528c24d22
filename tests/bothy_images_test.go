package tests

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestBothyCLIImages: bothy imports both archive kinds (from a file and from stdin),
// pulls from a loopback registry with its progress (plain lines off a terminal, a bar on
// one), lists images in every format, and deletes them, refusing with image-in-use while a
// sandbox uses one.
func TestBothyCLIImages(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withToken("ctl-images-0123456789abcdef"))
	img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin", "FROM=cli"}}, 64<<10)
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	d.ctlOK("", "image", "--help")
	d.wantFail(2, "image needs a subcommand", "image")
	d.wantFail(2, "needs 2 argument", "image", "import", "only-a-name")

	// Import: a docker save archive from a file, an OCI layout tarball from stdin.
	archive := filepath.Join(t.TempDir(), "bb.tar")
	if err := os.WriteFile(archive, dockerSave(t, img), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := d.ctlOK("", "image", "import", "bb-file", archive); out != "bb-file\n" {
		t.Fatalf("image import from a file printed %q", out)
	}
	if out := d.ctlOK(string(ociLayoutTar(t, img)), "image", "import", "bb-stdin", "-"); out != "bb-stdin\n" {
		t.Fatalf("image import from stdin printed %q", out)
	}
	d.wantFail(1, "no such file", "image", "import", "bb-none", filepath.Join(t.TempDir(), "missing.tar"))

	// Pull, flags after the reference, progress as plain lines on stderr off a terminal.
	ref := serveRegistry(t, img, "cli/busybox:v1")
	out, stderr, code := d.ctl("", "image", "pull", ref, "--name", "bb-pulled")
	if code != 0 || out != "bb-pulled\n" || !strings.Contains(stderr, "bb-pulled: 2 layers\n") ||
		!strings.Contains(stderr, "bb-pulled: 2/2 layers done") || strings.Contains(stderr, "\r") {
		t.Fatalf("image pull: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	// The top-level pull, flags first, quietly.
	if out, stderr, code := d.ctl("", "pull", "-q", "--name", "bb-quiet", ref); code != 0 || out != "bb-quiet\n" || stderr != "" {
		t.Fatalf("pull -q: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	d.wantFail(1, "has no image", "image", "pull", strings.TrimSuffix(ref, ":v1")+":missing", "--name", "bb-missing")

	// On a terminal, a bar drawn in place, then the name on a line of its own.
	tm := d.startOnTerminal(t, 24, 100, "image", "pull", ref, "--name", "bb-tty")
	tm.waitFor("bb-tty\r\n", "")
	if err := tm.cmd.Wait(); err != nil {
		t.Fatalf("image pull on a terminal: %v\n%q", err, tm.output())
	}
	if o := tm.output(); !strings.Contains(o, "\r\x1b[Kbb-tty [") || !strings.Contains(o, "2/2 layers") {
		t.Fatalf("image pull on a terminal drew no bar:\n%q", o)
	}

	// ls: JSON that parses, names, the table and the wide table.
	var list []imageJSON
	d.ctlJSON(&list, "image", "ls", "-o", "json")
	got := map[string]imageJSON{}
	for _, i := range list {
		got[i.Name] = i
	}
	for _, n := range []string{"bb-file", "bb-stdin", "bb-pulled", "bb-quiet", "bb-tty"} {
		// A docker save archive carries a manifest of its own making: only the others keep
		// the image's digest.
		if i := got[n]; i.Kind != "oci" || i.State != "ready" || (n != "bb-file" && i.Digest != digest.String()) {
			t.Errorf("image ls -o json: %s is %+v; want a ready OCI image of %s", n, i, digest)
		}
	}
	if got["host"].Kind != "host" {
		t.Errorf("image ls -o json lacks host: %+v", list)
	}
	// In name order, as the list pages by name.
	if out := d.ctlOK("", "images", "ls", "-o", "name"); !slices.IsSorted(strings.Fields(out)) || !slices.Contains(strings.Fields(out), "host") || !slices.Contains(strings.Fields(out), "bb-file") {
		t.Errorf("image ls -o name, in name order with host and bb-file:\n%s", out)
	}
	if out := d.ctlOK("", "image", "ls"); !strings.HasPrefix(out, "NAME") || !strings.Contains(out, "ready") || strings.Contains(out, "DIGEST") {
		t.Errorf("image ls:\n%s", out)
	}
	if out := d.ctlOK("", "image", "ls", "-o", "wide"); !strings.Contains(out, "DIGEST") || !strings.Contains(out, digest.String()) || !strings.Contains(out, ref) {
		t.Errorf("image ls -o wide:\n%s", out)
	}
	d.wantFail(2, "-o yaml is not one of", "image", "ls", "-o", "yaml")

	// rm: refused while a sandbox uses the image, naming it; then it goes.
	d.ctlOK("", "create", "on-image", "--image", "bb-file", "--start")
	if out := d.ctlOK("", "exec", "on-image", "--", "sh", "-c", "echo $FROM"); out != "cli\n" {
		t.Fatalf("exec on the imported image: %q", out)
	}
	if stderr := d.wantFail(1, "image-in-use", "image", "rm", "bb-file"); !strings.Contains(stderr, "sandbox on-image") {
		t.Errorf("image-in-use does not name the sandbox: %s", stderr)
	}
	d.wantFail(1, "image-not-found", "image", "rm", "no-such-image")
	if out := d.ctlOK("", "image", "rm", "bb-stdin", "bb-quiet"); out != "bb-stdin\nbb-quiet\n" {
		t.Fatalf("image rm of two printed %q", out)
	}
	d.ctlOK("", "stop", "-f", "on-image")
	d.ctlOK("", "rm", "on-image")
	if out := d.ctlOK("", "image", "rm", "bb-file"); out != "bb-file\n" {
		t.Fatalf("image rm once unused printed %q", out)
	}
	list = nil
	d.ctlJSON(&list, "image", "ls", "-o", "json")
	for _, i := range list {
		if i.Name == "bb-file" || i.Name == "bb-stdin" || i.Name == "bb-quiet" {
			t.Errorf("image ls after rm still lists %s", i.Name)
		}
	}
	if len(list) == 0 {
		t.Error("image ls -o json after rm lists nothing, not even host")
	}
}
