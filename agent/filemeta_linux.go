package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
)

var _ control.FileMetaServer = (*agent)(nil)

// ServesFileMeta implements control.FileMetaServer: stat and list answer details, write stores
// user metadata as MetadataXattrPrefix extended attributes, watch refuses network file
// systems when asked.
//
// The metadata lives in the file itself, as user.* extended attributes: it is the sandbox's
// data, stored where the sandbox's files are (surviving a stop, a pause, a template and a
// clone with them), written and read with the request user's permissions, and bounded by
// control.ValidateMetadata on the way in and by readMetadata on the way out, whatever root
// inside the sandbox put there.
func (a *agent) ServesFileMeta() {}

// Bounds of what is read to resolve owners: the first maxIDFileBytes of /etc/passwd and
// /etc/group, whatever the sandbox made of them.
const maxIDFileBytes = 1 << 20

// idNames maps the uids and gids of one stat or list to names, read once per request from
// the sandbox's /etc/passwd and /etc/group.
type idNames struct {
	users, groups map[uint32]string
}

// loadIDNames reads the sandbox's user and group names. It runs with the request user's
// identity (inside asUser), so it reads what that user may read; a file that is missing, not
// regular or on /proc (a link there would be the agent's own) leaves numbers in place of
// names.
func loadIDNames() *idNames {
	return &idNames{users: readIDFile("/etc/passwd"), groups: readIDFile("/etc/group")}
}

// readIDFile parses name:x:id:... lines: the first name given for an id wins, as getpwuid
// finds it; names longer than control.MaxOwnerLen or not printable are skipped.
func readIDFile(path string) map[uint32]string {
	out := map[uint32]string{}
	fd, err := openNoMagic(unix.AT_FDCWD, path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return out
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	var sfs unix.Statfs_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		unix.Fstatfs(fd, &sfs) != nil || sfs.Type == unix.PROC_SUPER_MAGIC {
		return out
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxIDFileBytes))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 4)
		if len(fields) < 3 || fields[0] == "" || len(fields[0]) > control.MaxOwnerLen || !printableName(fields[0]) {
			continue
		}
		id, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			continue
		}
		if _, ok := out[uint32(id)]; !ok {
			out[uint32(id)] = fields[0]
		}
	}
	return out
}

func printableName(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func nameOf(m map[uint32]string, id uint32) string {
	if n, ok := m[id]; ok {
		return n
	}
	return strconv.FormatUint(uint64(id), 10)
}

// addDetails fills fi's details for the file at path, which st describes (lstat). It runs
// with the request user's identity: a target or attributes the user may not read are left
// out. Nothing here follows a final symlink.
func (n *idNames) addDetails(fi *control.FileInfo, path string, st *syscall.Stat_t) {
	if st != nil {
		fi.Owner, fi.Group = nameOf(n.users, st.Uid), nameOf(n.groups, st.Gid)
	}
	if fi.Type == control.TypeSymlink {
		resolveLink(fi, path)
		return // symlinks carry no user attributes
	}
	fi.Metadata = readMetadata(path)
}

// resolveLink sets a symlink's target as the path it resolves to, through every link on
// the way (as the user may follow them), and the type and permissions of what is there. A
// link that does not resolve, that passes through one of /proc's magic links (which would
// describe the agent's own descriptors) or that ends in /proc gets its own path and no type.
func resolveLink(fi *control.FileInfo, path string) {
	fi.Target = path
	fd, err := openNoMagic(unix.AT_FDCWD, path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if unix.Fstatfs(fd, &sfs) != nil || sfs.Type == unix.PROC_SUPER_MAGIC || unix.Fstat(fd, &st) != nil {
		return
	}
	// The agent's own descriptor names where the open ended.
	buf := make([]byte, control.MaxPathLen)
	k, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf)
	if err != nil || k >= len(buf) || !filepath.IsAbs(string(buf[:k])) {
		return
	}
	fi.Target = string(buf[:k])
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.TargetType = control.TypeFile
	case unix.S_IFDIR:
		fi.TargetType = control.TypeDir
	default:
		fi.TargetType = control.TypeOther
	}
	fi.TargetMode = st.Mode & 0o7777
}

// readMetadata reads the MetadataXattrPrefix attributes of the file at path (not following a
// final symlink), at most control.MaxMetadataBytes of them in all and only those valid as
// metadata: root inside the sandbox may have set anything with setfattr.
func readMetadata(path string) map[string]string {
	names := make([]byte, 64<<10) // XATTR_LIST_MAX
	k, err := unix.Llistxattr(path, names)
	if err != nil || k <= 0 {
		return nil
	}
	var out map[string]string
	total := 0
	val := make([]byte, control.MaxMetadataBytes)
	for _, name := range bytes.Split(names[:k], []byte{0}) {
		key, ok := strings.CutPrefix(string(name), control.MetadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		vk, err := unix.Lgetxattr(path, string(name), val)
		if err != nil {
			continue // gone meanwhile, too large, or not the user's to read
		}
		m := map[string]string{key: string(val[:vk])}
		cost := len(name) + vk
		if total+cost > control.MaxMetadataBytes || control.ValidateMetadata(m) != nil {
			continue
		}
		total += cost
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(val[:vk])
	}
	return out
}

// writeMetadata stores m on the open file fd. A file system without user attributes (an
// old tmpfs) stores none, as E2B's envd does: the answer's entry then shows none.
func writeMetadata(fd int, m map[string]string) error {
	for k, v := range m {
		err := unix.Fsetxattr(fd, control.MetadataXattrPrefix+k, []byte(v), 0)
		if errors.Is(err, unix.EOPNOTSUPP) {
			return nil
		}
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
			// ext4 holds about one block of attributes per inode, less than the bound.
			return &control.RemoteError{Code: control.CodeNoSpace, Message: fmt.Sprintf(
				"The file system inside the sandbox has no room for this much metadata on one file (%q).", truncate(k))}
		}
		if err != nil {
			return fmt.Errorf("storing the metadata %q: %w", k, err)
		}
	}
	return nil
}

// Magic numbers of the file systems a watch refuses with RefuseNetwork (linux/magic.h and
// the file systems' own: CIFS and SMB2 have none there).
const (
	nfsMagic  = 0x6969
	cifsMagic = 0xFF534D42
	smbMagic  = 0x517B
	smb2Magic = 0xFE534D42
	fuseMagic = 0x65735546
)

// onNetworkFS reports whether the file system of path is a network or FUSE one.
func onNetworkFS(path string) (bool, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return false, err
	}
	return isNetworkFS(int64(sfs.Type)), nil
}

func isNetworkFS(magic int64) bool {
	switch uint32(magic) {
	case nfsMagic, cifsMagic, smbMagic, smb2Magic, fuseMagic:
		return true
	}
	return false
}
