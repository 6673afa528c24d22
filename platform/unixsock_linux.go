//go:build linux

package platform

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxSunPath is the room for a path in a unix socket address (108 bytes with the NUL).
const maxSunPath = 107

// DialUnix connects to a unix socket. A path too long for a socket address (deep state roots
// and 63-character sandbox ids exceed it) is reached through /proc/self/fd and a handle on its
// directory, opened without following a link.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxSunPath {
		return d.DialContext(ctx, "unix", path)
	}
	dirFD, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer unix.Close(dirFD)
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", dirFD, filepath.Base(path)))
}

// ListenUnix makes a unix stream socket listening at path, with mode perm, and returns it as
// a file, to be handed to another process (which may take it with net.FileListener). A socket
// already at path (left by an earlier run) is replaced; anything else there is an error. The
// socket is bound under a temporary name and renamed into place once it listens, so that path
// never names a socket that refuses connections. The directory is opened without following a
// link, and reached through /proc/self/fd, so a path of any length works.
//
// The listening socket records the credentials of the process that calls ListenUnix: they are
// what [PeerCred] reports to every client that connects, whoever accepts.
func ListenUnix(path string, perm os.FileMode) (*os.File, error) {
	dirFD, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer unix.Close(dirFD)
	name := filepath.Base(path)
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return nil, &os.PathError{Op: "listen", Path: path, Err: fmt.Errorf("something other than a socket is there")}
		}
	} else if err != unix.ENOENT {
		return nil, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	tmp := TempName(name)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
			_ = unix.Unlinkat(dirFD, tmp, 0)
		}
	}()
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d/%s", dirFD, tmp)}); err != nil {
		return nil, &os.PathError{Op: "bind", Path: filepath.Join(filepath.Dir(path), tmp), Err: err}
	}
	if err := unix.Fchmodat(dirFD, tmp, uint32(perm.Perm()), 0); err != nil {
		return nil, &os.PathError{Op: "chmod", Path: filepath.Join(filepath.Dir(path), tmp), Err: err}
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		return nil, os.NewSyscallError("listen", err)
	}
	if err := unix.Renameat(dirFD, tmp, dirFD, name); err != nil {
		return nil, &os.PathError{Op: "rename", Path: path, Err: err}
	}
	ok = true
	return os.NewFile(uintptr(fd), path), nil
}

// DialUnixNoFollow connects to the unix socket at path without following a link anywhere a
// less trusted process could have put one: path's directory is opened refusing a link, must
// belong to this process's effective user and be writable by nobody else, and path itself
// must be a socket of that user, not a link; the connection goes through a handle of that
// very socket (/proc/self/fd). Whoever could rename entries in the directory could still
// replace the socket, which is why the directory is checked.
func DialUnixNoFollow(ctx context.Context, path string) (net.Conn, error) {
	dir := filepath.Dir(path)
	dirFD, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dirFD)
	euid := uint32(os.Geteuid())
	var st unix.Stat_t
	if err := unix.Fstat(dirFD, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if st.Uid != euid || st.Mode&0o022 != 0 {
		return nil, &os.PathError{Op: "dial", Path: dir, Err: fmt.Errorf("the socket's directory belongs to uid %d with mode %o: others could replace the socket", st.Uid, st.Mode&0o7777)}
	}
	sockFD, err := unix.Openat(dirFD, filepath.Base(path), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(sockFD)
	if err := unix.Fstat(sockFD, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Uid != euid {
		return nil, &os.PathError{Op: "dial", Path: path, Err: fmt.Errorf("not a socket of uid %d (type %v, owner %d)", euid, modeFromUnix(st.Mode).Type(), st.Uid)}
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", sockFD))
}

// PeerCred returns the credentials (pid, uid, gid) of the peer of the unix socket connection
// conn (SO_PEERCRED), as the kernel recorded them: for a client, those of the process that
// called listen on the server's socket, which is not necessarily the one that accepted; the
// pid as seen from this process's pid namespace.
func PeerCred(conn net.Conn) (pid, uid, gid int, err error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return 0, 0, 0, fmt.Errorf("platform: %T is not a socket connection", conn)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, 0, 0, err
	}
	var (
		cred *unix.Ucred
		cerr error
	)
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, 0, err
	}
	if cerr != nil {
		return 0, 0, 0, os.NewSyscallError("getsockopt SO_PEERCRED", cerr)
	}
	return int(cred.Pid), int(cred.Uid), int(cred.Gid), nil
}

// ReceivedFiles makes files, each named name, of the descriptors that the control messages
// oob of one received message carried (SCM_RIGHTS). It returns every file it made also with
// an error (a malformed message), so that the caller can close them all.
func ReceivedFiles(oob []byte, name string) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	var files []*os.File
	for _, m := range msgs {
		fds, perr := unix.ParseUnixRights(&m)
		if perr != nil {
			err = errors.Join(err, perr)
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), name))
		}
	}
	return files, err
}
