//go:build linux

package registry

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// paxXattr prefixes the PAX records that carry an entry's extended attributes (GNU tar's
// and archive/tar's convention).
const paxXattr = "SCHILY.xattr."

// keptXattr reports whether an extended attribute travels with a generation. overlayfs's
// opaque mark must (it hides the image's directory below), user attributes and file
// capabilities are the sandbox's own; anything else (other trusted.overlay.* attributes
// steer overlayfs's lookups, security.* other than capabilities belong to the host's
// security modules) is neither written nor accepted.
func keptXattr(name string) bool {
	return name == "trusted.overlay.opaque" || name == "security.capability" || strings.HasPrefix(name, "user.")
}

// writeArchive writes the tree below dir to w as a tar stream that is the same, byte for
// byte, for the same tree: entries sorted by name, no user or group names, no access or
// change times. So the same payload always has the same digest and a registry that holds
// it is not sent it again.
//
// A regular file of BlobThreshold bytes or more is written without its content, with its
// digest and size in PAX records; blobs, filled by the first pass and read by later ones,
// holds those files.
func writeArchive(w io.Writer, dir *os.File, blobs *blobIndex) error {
	tw := tar.NewWriter(w)
	aw := &archiver{tw: tw, links: map[[2]uint64]string{}, blobs: blobs}
	if err := aw.walk(dir, ""); err != nil {
		return err
	}
	return tw.Close()
}

type archiver struct {
	blobs *blobIndex
	tw    *tar.Writer
	links map[[2]uint64]string // (dev, ino) of a regular file with more links -> its first name
}

func (a *archiver) walk(dir *os.File, rel string) error {
	names, err := platform.ReadDirNames(dir)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, n := range names {
		if err := a.entry(dir, rel, n); err != nil {
			return err
		}
	}
	return nil
}

func (a *archiver) entry(dir *os.File, rel, base string) error {
	name := path.Join(rel, base)
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("registry: stat %s: %w", name, err)
	}
	hdr := &tar.Header{
		Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()).UTC(), Format: tar.FormatPAX,
	}
	xattrs, err := readXattrs(dir, base)
	if err != nil {
		return fmt.Errorf("registry: xattrs of %s: %w", name, err)
	}
	if len(xattrs) > 0 {
		hdr.PAXRecords = map[string]string{}
		for k, v := range xattrs {
			hdr.PAXRecords[paxXattr+k] = v
		}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if err := a.tw.WriteHeader(hdr); err != nil {
			return err
		}
		sub, err := platform.OpenDirAt(dir, base)
		if err != nil {
			return err
		}
		defer sub.Close()
		return a.walk(sub, name)
	case unix.S_IFREG:
		id := [2]uint64{uint64(st.Dev), st.Ino}
		if first, ok := a.links[id]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return a.tw.WriteHeader(hdr)
		}
		if st.Nlink > 1 {
			a.links[id] = name
		}
		fd, err := unix.Openat(int(dir.Fd()), base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("registry: open %s: %w", name, err)
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
		if st.Size >= BlobThreshold {
			d, err := a.blobs.digestFile(name, f, st.Size)
			if err != nil {
				return fmt.Errorf("registry: read %s: %w", name, err)
			}
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords[paxBlob], hdr.PAXRecords[paxBlobSize] = d.String(), strconv.FormatInt(st.Size, 10)
			hdr.Size = 0
			return a.tw.WriteHeader(hdr)
		}
		if err := a.tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.CopyN(a.tw, f, st.Size); err != nil {
			return fmt.Errorf("registry: read %s: %w", name, err)
		}
		return nil
	case unix.S_IFLNK:
		target, err := readlinkAt(dir, base)
		if err != nil {
			return fmt.Errorf("registry: readlink %s: %w", name, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return a.tw.WriteHeader(hdr)
	case unix.S_IFCHR:
		hdr.Typeflag = tar.TypeChar
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		return a.tw.WriteHeader(hdr)
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return a.tw.WriteHeader(hdr)
	}
	return nil // a socket or block device means nothing in a generation; a capture keeps none
}

func readlinkAt(dir *os.File, base string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(int(dir.Fd()), base, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// procPath names the entry base of dir for the path-based xattr calls, through the
// directory's handle: no link on the way to dir is followed, and base itself is not (the l*
// calls).
func procPath(dir int, base string) string {
	return "/proc/self/fd/" + strconv.Itoa(dir) + "/" + base
}

func readXattrs(dir *os.File, base string) (map[string]string, error) {
	p := procPath(int(dir.Fd()), base)
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out map[string]string
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		if k == "" || !keptXattr(k) {
			continue
		}
		val := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, k, val)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = string(val[:m])
	}
	return out, nil
}

// resolveParent opens the directory a tar entry's parent names below root, never following
// a link and never leaving root (RESOLVE_BENEATH refuses "..", absolute paths and links
// that would leave it; RESOLVE_NO_SYMLINKS refuses every symbolic link on the way).
var resolveParent = unix.OpenHow{
	Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
}

// cleanEntryName checks a tar entry's name: relative, clean, without "..": anything else is
// a registry trying to write outside the payload, refused by name.
func cleanEntryName(n string) (string, error) {
	n = strings.TrimSuffix(n, "/")
	if n == "" || n == "." || strings.HasPrefix(n, "/") || strings.ContainsRune(n, 0) || len(n) > unix.PathMax ||
		path.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") || strings.Contains(n, "/../") || strings.HasSuffix(n, "/..") {
		return "", hostile("the archive has an entry named %q, which is not a clean path inside the generation", clipName(n))
	}
	return n, nil
}

func clipName(n string) string {
	if len(n) > 120 {
		return n[:120] + "..."
	}
	return n
}

// extractor unpacks a generation's archive below root, an empty directory.
type extractor struct {
	// files are the payload's large files the manifest lists, by digest; open reads one,
	// checked against its descriptor.
	files    map[v1.Hash]v1.Descriptor
	open     func(v1.Descriptor) (blobReader, error)
	root     *os.File
	limits   Limits
	regular  map[string]bool // regular files unpacked so far: the only targets a hard link may name
	dirTimes []dirTime
	size     int64
	entries  int
}

type dirTime struct {
	name string
	t    time.Time
}

// extractArchive unpacks the tar stream r below root and flushes its file system, returning
// the bytes of the regular files it wrote.
func extractArchive(r io.Reader, root *os.File, limits Limits, files map[v1.Hash]v1.Descriptor, open func(v1.Descriptor) (blobReader, error)) (int64, error) {
	x := &extractor{root: root, limits: limits, regular: map[string]bool{}, files: files, open: open}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, hostile("the generation's archive is not a valid tar stream: %v", err)
		}
		x.entries++
		if x.entries > limits.MaxEntries {
			return 0, hostile("the generation's archive has more than %d entries", limits.MaxEntries)
		}
		if err := x.entry(hdr, tr); err != nil {
			return 0, err
		}
	}
	for i := len(x.dirTimes) - 1; i >= 0; i-- {
		d := x.dirTimes[i]
		ts := []unix.Timespec{unix.NsecToTimespec(d.t.UnixNano()), unix.NsecToTimespec(d.t.UnixNano())}
		if err := unix.UtimesNanoAt(int(root.Fd()), d.name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return 0, err
		}
	}
	if err := platform.IgnoringEINTR(func() error { return unix.Syncfs(int(root.Fd())) }); err != nil {
		return 0, fmt.Errorf("registry: flush the pulled generation: %w", err)
	}
	return x.size, nil
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := path.Split(name)
	pfd := int(x.root.Fd())
	if dir != "" {
		fd, err := unix.Openat2(pfd, strings.TrimSuffix(dir, "/"), &resolveParent)
		if err != nil {
			return hostile("the archive's entry %q is below %q, which is not a directory unpacked before it (%v)", clipName(name), clipName(dir), err)
		}
		defer unix.Close(fd)
		pfd = fd
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<32-2 || hdr.Gid > 1<<32-2 {
		return hostile("the archive's entry %q has owner %d:%d", clipName(name), hdr.Uid, hdr.Gid)
	}
	linked, err := x.make(pfd, hdr, name, base, r)
	if err != nil || linked {
		return err // a hard link shares its target's owner, mode, xattrs and times
	}
	return x.attrs(pfd, hdr, name, base)
}

// make makes the entry itself; linked is true for a hard link, which has no attributes of
// its own.
func (x *extractor) make(pfd int, hdr *tar.Header, name, base string, r io.Reader) (linked bool, err error) {
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return false, x.exists(name, err)
		}
		x.dirTimes = append(x.dirTimes, dirTime{name, hdr.ModTime})
	case tar.TypeReg:
		return false, x.file(pfd, hdr, name, base, r)
	case tar.TypeSymlink:
		if hdr.Linkname == "" || len(hdr.Linkname) > unix.PathMax || strings.ContainsRune(hdr.Linkname, 0) {
			return false, hostile("the archive's link %q has an invalid target", clipName(name))
		}
		// The target is the sandbox's business: nothing on the host side follows it (every
		// resolution here refuses links, and a clone reads it inside its own root).
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return false, x.exists(name, err)
		}
	case tar.TypeLink:
		return true, x.hardlink(pfd, hdr, name, base)
	case tar.TypeChar:
		// Only overlayfs's whiteout (0/0): no other device is ever part of a generation.
		if hdr.Devmajor != 0 || hdr.Devminor != 0 {
			return false, hostile("the archive's entry %q is the device %d:%d; only whiteouts (0:0) are accepted", clipName(name), hdr.Devmajor, hdr.Devminor)
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFCHR|0o600, 0); err != nil {
			return false, x.exists(name, err)
		}
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return false, x.exists(name, err)
		}
	default:
		return false, hostile("the archive's entry %q has the type %q, which no generation holds", clipName(name), string(hdr.Typeflag))
	}
	return false, nil
}

// file writes a regular file, its content from the archive or, for a large file, from the
// blob its PAX records name, which must be one the manifest lists.
func (x *extractor) file(pfd int, hdr *tar.Header, name, base string, r io.Reader) error {
	size, content := hdr.Size, r
	if ref, ok := hdr.PAXRecords[paxBlob]; ok {
		d, err := v1.NewHash(ref)
		desc, listed := x.files[d]
		if err != nil || !listed || hdr.Size != 0 || hdr.PAXRecords[paxBlobSize] != strconv.FormatInt(desc.Size, 10) {
			return hostile("the archive's file %q names the blob %q, which the manifest does not list with its size", clipName(name), clipName(ref))
		}
		blob, err := x.open(desc)
		if err != nil {
			return err
		}
		defer blob.Close()
		size, content = desc.Size, blob
		if err := x.write(pfd, name, base, size, content); err != nil {
			return err
		}
		// One byte more, so that a blob longer than declared is refused.
		if _, err := io.Copy(io.Discard, blob); err != nil {
			return err
		}
		return blob.verify()
	}
	return x.write(pfd, name, base, size, content)
}

func (x *extractor) write(pfd int, name, base string, size int64, r io.Reader) error {
	if size < 0 || x.size+size > x.limits.MaxBytes {
		return hostile("the archive's files add up to more than %d bytes", x.limits.MaxBytes)
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return x.exists(name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = io.CopyN(f, r, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errcode.Of(err) != "" {
			return err
		}
		return fmt.Errorf("registry: write %s: %w", clipName(name), err)
	}
	x.size += size
	x.regular[name] = true
	return nil
}

// hardlink links name to an earlier regular file of the archive.
func (x *extractor) hardlink(pfd int, hdr *tar.Header, name, base string) error {
	target, err := cleanEntryName(hdr.Linkname)
	if err != nil || !x.regular[target] {
		return hostile("the archive's hard link %q names %q, not a regular file unpacked before it", clipName(name), clipName(hdr.Linkname))
	}
	tdir, tbase := path.Split(target)
	tfd := int(x.root.Fd())
	if tdir != "" {
		fd, err := unix.Openat2(tfd, strings.TrimSuffix(tdir, "/"), &resolveParent)
		if err != nil {
			return hostile("the archive's hard link %q names %q, which cannot be resolved (%v)", clipName(name), clipName(target), err)
		}
		defer unix.Close(fd)
		tfd = fd
	}
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return x.exists(name, err)
	}
	return nil
}

// attrs gives an entry its owner, mode, xattrs and (but for directories, whose times are set
// once they are full) times.
func (x *extractor) attrs(pfd int, hdr *tar.Header, name, base string) error {
	mode := uint32(hdr.Mode) & 0o7777
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("registry: chown %s: %w", clipName(name), err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears the set-id bits.
		if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
			return fmt.Errorf("registry: chmod %s: %w", clipName(name), err)
		}
	}
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			continue
		}
		if !keptXattr(attr) {
			return hostile("the archive's entry %q carries the extended attribute %q, which no generation holds", clipName(name), clipName(attr))
		}
		if err := unix.Lsetxattr(procPath(pfd, base), attr, []byte(v), 0); err != nil {
			return fmt.Errorf("registry: set %s on %s: %w", attr, clipName(name), err)
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("registry: times of %s: %w", clipName(name), err)
		}
	}
	return nil
}

func (x *extractor) exists(name string, err error) error {
	if errors.Is(err, unix.EEXIST) {
		return hostile("the archive has the entry %q twice", clipName(name))
	}
	return fmt.Errorf("registry: make %s: %w", clipName(name), err)
}
