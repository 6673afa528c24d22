package agent

import (
	"bytes"
	"context"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
)

// wantName is the name the system's own lookup gives uid (or gid), else the number.
func wantName(id int, group bool) string {
	s := strconv.Itoa(id)
	if group {
		if g, err := user.LookupGroupId(s); err == nil {
			return g.Name
		}
		return s
	}
	if u, err := user.LookupId(s); err == nil {
		return u.Username
	}
	return s
}

func TestFileMetadataAndDetails(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	if !slices.Contains(c.Features(), control.FeatureFileMeta) {
		t.Fatalf("features %v lack %s", c.Features(), control.FeatureFileMeta)
	}
	ctx := context.Background()
	dir := userDir(t)
	path := filepath.Join(dir, "meta.txt")
	meta := map[string]string{"author": "ada", "purpose": "a test, with spaces"}
	if _, err := c.WriteFile(ctx, control.WriteRequest{Path: path, Metadata: meta}, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	fi, err := c.StatDetails(ctx, path, "")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(fi.Metadata, meta) {
		t.Errorf("stat metadata %v, want %v", fi.Metadata, meta)
	}
	uid := os.Getuid()
	if isRoot() {
		uid = 1000 // the agent wrote as "user"
	}
	if fi.Owner != wantName(uid, false) || fi.Group != wantName(uid, true) {
		t.Errorf("owner %q group %q, want %q %q", fi.Owner, fi.Group, wantName(uid, false), wantName(uid, true))
	}
	// Without details, none.
	if plain, err := c.Stat(ctx, path, ""); err != nil || plain.Owner != "" || plain.Metadata != nil {
		t.Errorf("plain stat: %+v %v", plain, err)
	}

	if err := os.Symlink("meta.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	infos, _, err := c.ListDetails(ctx, dir, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]control.FileInfo{}
	for _, fi := range infos {
		byName[fi.Name] = fi
	}
	if got := byName["meta.txt"]; !maps.Equal(got.Metadata, meta) || got.Owner == "" {
		t.Errorf("listed %+v, want metadata %v", got, meta)
	}
	if got := byName["link"]; got.Type != control.TypeSymlink || got.Target != path || got.TargetType != control.TypeFile ||
		got.TargetMode != 0o644 || got.Metadata != nil {
		t.Errorf("listed link %+v", got)
	}
	// A link that resolves nowhere, or into /proc, names itself and no type.
	for name, to := range map[string]string{"dangling": "nowhere", "proc": "/proc/self/fd/0"} {
		p := filepath.Join(dir, name)
		if err := os.Symlink(to, p); err != nil {
			t.Fatal(err)
		}
		if fi, err := c.StatDetails(ctx, p, ""); err != nil || fi.Target != p || fi.TargetType != "" {
			t.Errorf("stat of a link to %s: %+v %v", to, fi, err)
		}
	}

	// A write replaces the file, metadata and all.
	if _, err := c.WriteFile(ctx, control.WriteRequest{Path: path}, strings.NewReader("y")); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.StatDetails(ctx, path, ""); err != nil || fi.Metadata != nil {
		t.Errorf("after a write without metadata: %+v %v", fi, err)
	}

	// Root's files are root's; /etc/passwd resolves the name.
	if isRoot() {
		if fi, err := c.StatDetails(ctx, "/", control.Root); err != nil || fi.Owner != wantName(0, false) || fi.Group != wantName(0, true) {
			t.Errorf("stat of /: %+v %v", fi, err)
		}
	}

	// Metadata beyond the bounds is refused before anything is written.
	bad := []map[string]string{
		{"": "empty key"},
		{"k": "caf\u00e9"},
		{"with space": "v"},
		{strings.Repeat("k", control.MaxMetadataKeyLen+1): "v"},
		{"a": strings.Repeat("v", control.MaxMetadataBytes)},
	}
	for _, m := range bad {
		p := filepath.Join(dir, "refused")
		_, err := c.WriteFile(ctx, control.WriteRequest{Path: p, Metadata: m}, strings.NewReader("x"))
		if errcode.Of(err) != errcode.InvalidRequest {
			t.Errorf("metadata %.40v: %v, want invalid-request", m, err)
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("metadata %.40v: the file was written", m)
		}
	}
}

// TestReadMetadataIsBounded: what else a file's attributes hold is not metadata: another
// namespace, values that are not printable, and what goes beyond the bound, which root
// inside a sandbox may set by hand (on tmpfs, which holds more than ext4's one block).
func TestReadMetadataIsBounded(t *testing.T) {
	t.Parallel()
	f, err := os.CreateTemp("/dev/shm", "meta")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	f.Close()
	p := f.Name()
	defer os.Remove(p)
	set := func(name string, v []byte) {
		t.Helper()
		if err := unix.Setxattr(p, name, v, 0); err != nil {
			t.Skip("no user attributes here:", err)
		}
	}
	set("user.other", []byte("no"))
	set(control.MetadataXattrPrefix+"bin", []byte{0xff, 0})
	set(control.MetadataXattrPrefix+"huge", bytes.Repeat([]byte("v"), control.MaxMetadataBytes+1))
	set(control.MetadataXattrPrefix+"ok", []byte("yes"))
	if got := readMetadata(p); !maps.Equal(got, map[string]string{"ok": "yes"}) {
		t.Errorf("read %.80v", got)
	}
	// Past the total bound, keys are left out: never more than MaxMetadataBytes.
	for i := range 3 {
		set(control.MetadataXattrPrefix+"k"+strconv.Itoa(i), bytes.Repeat([]byte("v"), 1500))
	}
	got := readMetadata(p)
	total := 0
	for k, v := range got {
		total += len(control.MetadataXattrPrefix) + len(k) + len(v)
	}
	if total > control.MaxMetadataBytes || len(got) < 2 {
		t.Errorf("read %d keys of %d bytes", len(got), total)
	}
}

// TestListDetailsFitFrames: entries at the bound of metadata, in characters JSON escapes,
// still list (each frame within control.MaxFramePayload).
func TestListDetailsFitFrames(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	// On tmpfs: ext4 holds less than the bound in one inode's attributes.
	dir, err := os.MkdirTemp("/dev/shm", "agtmeta")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	const files = 70
	key := "k"
	meta := map[string]string{key: strings.Repeat("<", control.MaxMetadataBytes-len(control.MetadataXattrPrefix)-len(key))}
	for i := range files {
		p := filepath.Join(dir, strconv.Itoa(i))
		if _, err := c.WriteFile(ctx, control.WriteRequest{Path: p, Metadata: meta}, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	infos, _, err := c.ListDetails(ctx, dir, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fi := range infos {
		if maps.Equal(fi.Metadata, meta) {
			n++
		}
	}
	if n != files {
		t.Errorf("%d of %d entries listed with their metadata", n, files)
	}
}

func TestReadIDFileIsBounded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "passwd")
	long := strings.Repeat("n", control.MaxOwnerLen+1)
	content := "root:x:0:0::/:/bin/sh\nfirst:x:7:7::/:/bin/sh\nsecond:x:7:7::/:/bin/sh\n" +
		long + ":x:8:8::/:/bin/sh\nbad name:x:9:9::/:/bin/sh\nnonum:x:abc:1::/:/bin/sh\nshort\n"
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	m := readIDFile(p)
	want := map[uint32]string{0: "root", 7: "first"}
	if !maps.Equal(m, want) {
		t.Errorf("parsed %v, want %v", m, want)
	}
	// A FIFO there would block a reader that opened it plainly.
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if m := readIDFile(fifo); len(m) != 0 {
		t.Errorf("a FIFO gave %v", m)
	}
	if got := nameOf(m, 42); got != "42" {
		t.Errorf("an unknown id is %q", got)
	}
}

func TestNetworkFileSystems(t *testing.T) {
	t.Parallel()
	for _, magic := range []int64{nfsMagic, cifsMagic, smbMagic, smb2Magic, fuseMagic} {
		if !isNetworkFS(magic) {
			t.Errorf("%#x is not taken for a network file system", magic)
		}
	}
	for _, magic := range []int64{unix.EXT4_SUPER_MAGIC, unix.TMPFS_MAGIC, unix.OVERLAYFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC} {
		if isNetworkFS(magic) {
			t.Errorf("%#x is taken for a network file system", magic)
		}
	}
	// A local directory is watched with RefuseNetwork.
	ta := startAgent(t)
	c := ta.dial(t)
	w, err := c.Watch(context.Background(), control.WatchRequest{Path: worldDir(t), User: control.Root, RefuseNetwork: true})
	if err != nil {
		t.Fatalf("a local directory was refused: %v", err)
	}
	w.Close()
}
