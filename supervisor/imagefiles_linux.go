//go:build linux

package supervisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// ImageFilesName is the layer of files bothyd adds to a sandbox on an OCI image, in its
// state directory: stacked right above the image's layers (below a clone's generation and
// the sandbox's own writable layer), made afresh at every launch, never written into the
// image's layers, which other sandboxes share.
const ImageFilesName = "imagefiles"

// The sandbox's user, as the agent runs it (see package agent) and the host image's /etc
// names it.
const (
	sandboxUID  = 1000
	sandboxGID  = 1000
	sandboxHome = "home/user"
	// maxImageFile bounds what is read of an image's /etc/passwd or /etc/group.
	maxImageFile = 1 << 20
)

// writeImageFiles makes the image files layer in dir for an image whose layer directories
// are layers (top first): the sandbox's /etc/hostname and /etc/hosts, an /etc/resolv.conf,
// /etc/passwd and /etc/group with an entry for the sandbox's user when the image has none
// (the image's own entries kept), and the directories an exec needs that the image lacks:
// the user's home, /root, /tmp and the image's WorkingDir.
func writeImageFiles(dir string, layers []string, cfg ImageConfig, hostname string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	img, err := openLayers(layers)
	if err != nil {
		return err
	}
	defer img.Close()
	etc := filepath.Join(dir, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"hostname": hostname + "\n",
		"hosts":    runtime.EtcHosts(hostname),
		// The sandbox has no network but loopback; a resolver that points nowhere fails fast.
		"resolv.conf": "nameserver 127.0.0.1\n",
	}
	passwd, err := img.read("etc/passwd")
	if err != nil {
		return err
	}
	if b, ok := withEntry(passwd, sandboxUID, fmt.Sprintf("user:x:%d:%d:user:/%s:/bin/sh", sandboxUID, sandboxGID, sandboxHome),
		"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", 2); ok {
		files["passwd"] = b
	}
	group, err := img.read("etc/group")
	if err != nil {
		return err
	}
	if b, ok := withEntry(group, sandboxGID, fmt.Sprintf("user:x:%d:", sandboxGID), "root:x:0:\nnogroup:x:65534:\n", 2); ok {
		files["group"] = b
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	dirs := []struct {
		name     string
		perm     os.FileMode
		uid, gid int
	}{
		{"root", 0o700, 0, 0},
		{"tmp", os.ModeSticky | 0o777, 0, 0},
		{"home", 0o755, 0, 0},
		{sandboxHome, 0o755, sandboxUID, sandboxGID},
	}
	if wd := path.Clean("/" + cfg.WorkingDir); cfg.WorkingDir != "" && wd != "/" {
		dirs = append(dirs, struct {
			name     string
			perm     os.FileMode
			uid, gid int
		}{wd[1:], 0o755, 0, 0})
	}
	made := map[string]bool{}
	for _, d := range dirs {
		// The first of two that name one directory decides (the user's home as WorkingDir
		// stays the user's).
		if made[d.name] || img.exists(d.name) {
			continue
		}
		made[d.name] = true
		p := filepath.Join(dir, d.name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.perm); err != nil {
			return err
		}
		if err := os.Chown(p, d.uid, d.gid); err != nil {
			return err
		}
	}
	return nil
}

// withEntry returns the file content (of /etc/passwd or /etc/group) with an entry for id in
// its third field added, or def with it when the image has no such file; ok is false when the
// image's file has the entry already and is to be left as it is.
func withEntry(content []byte, id int, entry, def string, field int) (string, bool) {
	if content == nil {
		return def + entry + "\n", true
	}
	sc := bufio.NewScanner(bytes.NewReader(content))
	sc.Buffer(make([]byte, 0, 4096), maxImageFile)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), ":")
		if len(parts) > field && parts[field] == fmt.Sprint(id) {
			return "", false
		}
	}
	s := string(content)
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s + entry + "\n", true
}

// imageLayers are an image's layer directories, top first, for looking up what the image
// holds as an overlay of them would show it.
type imageLayers []*os.File

func openLayers(paths []string) (imageLayers, error) {
	var out imageLayers
	for _, p := range paths {
		f, err := platform.OpenDir(p)
		if err != nil {
			out.Close()
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func (l imageLayers) Close() {
	for _, f := range l {
		f.Close()
	}
}

// find opens rel in the topmost layer that has it. Each layer is resolved as its own root
// (links inside it cannot lead out); a whiteout (a 0/0 character device) or anything else
// that is not there hides the lower layers, as the overlay does. Opaque directories are not
// considered: a file an opaque directory hides may be found. nil means absent.
func (l imageLayers) find(rel string, flags int) (*os.File, error) {
	for _, root := range l {
		f, err := platform.OpenInRoot(root, rel, flags)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil // a path through a whiteout or a file: the overlay shows nothing there
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return nil, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			f.Close()
			return nil, nil
		}
		return f, nil
	}
	return nil, nil
}

func (l imageLayers) exists(rel string) bool {
	f, err := l.find(rel, unix.O_PATH)
	if f != nil {
		f.Close()
	}
	return err == nil && f != nil
}

// read returns the content of the regular file rel of the image, nil when it has none.
func (l imageLayers) read(rel string) ([]byte, error) {
	f, err := l.find(rel, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil || f == nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxImageFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxImageFile {
		return nil, fmt.Errorf("the image's /%s is larger than %d bytes", rel, maxImageFile)
	}
	return b, nil
}
