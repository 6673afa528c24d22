package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/bothy/bothy/server"
)

// tokenFileName is the generated token's file in the state root. bothy reads it there.
const tokenFileName = "token"

// apiToken decides the server's token: the one in --token-file, none with
// --insecure-no-auth, and otherwise the one generated into the state root (made on the first
// start, kept for the next). how says which, for the start-up log.
func apiToken(o *options, log *slog.Logger) (token, how string, err error) {
	switch {
	case o.tokenFile != "" && o.insecureNoAuth:
		return "", "", errors.New("--token-file and --insecure-no-auth contradict each other; give one")
	case o.tokenGroup != "" && (o.tokenFile != "" || o.insecureNoAuth):
		return "", "", errors.New("--token-group shares the token that bothyd generates into its state root; it goes with neither --token-file nor --insecure-no-auth")
	case o.tokenFile != "":
		token, err = readToken(o.tokenFile, log)
		return token, "file", err
	case o.insecureNoAuth:
		log.Warn("serving without a token (--insecure-no-auth): any user of this host can drive sandboxes as the user bothyd runs as")
		return "", "none", nil
	}
	token, err = generatedToken(o.root, o.tokenGroup, log)
	return token, "generated", err
}

// generatedToken returns the token in <root>/token, making it first if there is none. Only
// the user that runs bothyd can read it (mode 0600, in a root of mode 0700), so that only
// that user, and whom they give it to, can drive the server. With a group (--token-group),
// that group's members can read it too (shareToken).
//
// The token is written whole to a temporary file, synced, and then linked to its name, which
// fails if the name exists: a crash leaves either no token or a whole one, never an empty
// file, and two servers started at once on one root agree on one token.
func generatedToken(root, group string, log *slog.Logger) (string, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("creating the state root for its token: %w", err)
	}
	path := filepath.Join(root, tokenFileName)
	token, err := readGeneratedToken(path, group != "", log)
	if !errors.Is(err, fs.ErrNotExist) {
		if err == nil && group != "" {
			err = shareToken(root, path, group, log)
		}
		return token, err
	}
	token, err = server.NewSecret(32)
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(root, ".token-*") // mode 0600
	if err != nil {
		return "", fmt.Errorf("writing the token: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(token + "\n")
	if err == nil && group != "" {
		// Shared before it has its name, so that the token never appears with a mode the
		// option does not give it.
		err = shareFile(tmp, group)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("writing the token: %w", err)
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		// Another bothyd made it first: use theirs.
		token, err := readGeneratedToken(path, group != "", log)
		if err == nil && group != "" {
			err = shareToken(root, path, group, log)
		}
		return token, err
	} else if err != nil {
		return "", fmt.Errorf("writing the token: %w", err)
	}
	if err := syncDir(root); err != nil {
		return "", fmt.Errorf("writing the token: %w", err)
	}
	if group != "" {
		if err := shareRoot(root, group, log); err != nil {
			return "", err
		}
	}
	log.Info("generated an API token", "path", path, "group", group)
	return token, nil
}

// readGeneratedToken reads the token file that bothyd made. It refuses a link or another
// kind of file, and a file that another user owns, which could hold a token someone else
// chose.
func readGeneratedToken(path string, shared bool, log *slog.Logger) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return "", fmt.Errorf("the token file %s is a link; remove it, and bothyd makes a new token", path)
		}
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("the token file %s is not a regular file; remove it, and bothyd makes a new token", path)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return "", fmt.Errorf("the token file %s belongs to uid %d, not to the user bothyd runs as (%d); remove it, and bothyd makes a new token", path, sys.Uid, os.Geteuid())
	}
	switch {
	case shared && st.Mode().Perm()&0o037 != 0:
		log.Warn("the token file is open to other users beyond its group, who can then drive sandboxes; bothyd makes it 0640", "path", path)
	case !shared && st.Mode().Perm()&0o077 != 0:
		log.Warn("the token file is readable by other users, who can then drive sandboxes; chmod 600 it unless you meant to share it (--token-group does that for one group)", "path", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("reading the token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < 16 {
		return "", fmt.Errorf("the token in %s is shorter than 16 characters; remove the file, and bothyd makes a new token", path)
	}
	return token, nil
}

// shareToken gives group's members the token and nothing else of the state root: the token
// file becomes mode 0640 in the group, and the root shareRoot's 0710. It runs at every start,
// so a token made again after its removal is shared as the first one was, and a group
// changed in the configuration takes effect.
func shareToken(root, path, group string, log *slog.Logger) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("sharing the token with its group: %w", err)
	}
	defer f.Close()
	if err := shareFile(f, group); err != nil {
		return err
	}
	return shareRoot(root, group, log)
}

// shareFile makes f mode 0640 in group, through its descriptor (no path to race on).
func shareFile(f *os.File, group string) error {
	gid, err := lookupGroup(group)
	if err != nil {
		return err
	}
	if err := f.Chown(-1, gid); err != nil {
		return fmt.Errorf("giving the token to the group %s: %w", group, err)
	}
	if err := f.Chmod(0o640); err != nil {
		return fmt.Errorf("giving the token to the group %s: %w", group, err)
	}
	return nil
}

// shareRoot makes the state root mode 0710 in group: its members may pass through it to a
// name they know (the token) but not list it, and other users get nowhere. A member reaches
// anything else in the root only where that entry's own mode lets any user in, which none
// that bothyd makes does (each is 0700 or 0600, or a socket no other user may write); an
// entry that does is logged, as that would give away more than the token.
func shareRoot(root, group string, log *slog.Logger) error {
	gid, err := lookupGroup(group)
	if err != nil {
		return err
	}
	d, err := os.Open(root)
	if err != nil {
		return fmt.Errorf("sharing the state root's token: %w", err)
	}
	defer d.Close()
	if err := d.Chown(-1, gid); err != nil {
		return fmt.Errorf("giving the state root to the group %s: %w", group, err)
	}
	if err := d.Chmod(0o710); err != nil {
		return fmt.Errorf("giving the state root to the group %s: %w", group, err)
	}
	entries, err := d.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("listing the state root: %w", err)
	}
	var open []string
	for _, e := range entries {
		if e.Name() == tokenFileName {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if reachableByOthers(fi.Mode()) {
			open = append(open, e.Name())
		}
	}
	if len(open) > 0 {
		log.Warn("entries of the state root that any user who can pass through it may use; the token's group can, so chmod o-rwx them", "root", root, "entries", open)
	}
	return nil
}

// reachableByOthers reports whether a user who is neither a file's owner nor in its group can
// use it by its name: list or enter a directory, read a file, connect to a socket.
func reachableByOthers(m fs.FileMode) bool {
	switch {
	case m&fs.ModeSymlink != 0:
		return false // the link's target decides, and it is outside the root or judged itself
	case m.IsDir():
		return m.Perm()&0o005 != 0
	case m&fs.ModeSocket != 0:
		return m.Perm()&0o002 != 0
	}
	return m.Perm()&0o006 != 0
}

// lookupGroup is the id of the group named name (or given by its number).
func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		// A number names the group with that id, if there is one.
		if id, perr := strconv.Atoi(name); perr == nil {
			if _, err = user.LookupGroupId(name); err == nil {
				return id, nil
			}
		}
		return 0, fmt.Errorf("--token-group %s: %w (the packages create the group bothy; `groupadd --system %s` makes it)", name, err, name)
	}
	return strconv.Atoi(g.Gid)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// logLogin prints the dashboard's one-time login URL. It carries a code that POST /login
// exchanges once, within server.DefaultLoginTTL, for the token; the token itself never reaches
// the log.
func logLogin(srv *server.Server, addr net.Addr, log *slog.Logger) error {
	code, err := srv.IssueLogin(server.DefaultLoginTTL)
	if err != nil {
		return err
	}
	host := addr.String()
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		// A browser cannot open 0.0.0.0 everywhere; this host's loopback always works.
		host = net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
	}
	log.Info("dashboard login", "url", "http://"+host+"/#login="+code, "valid", "once, for "+server.DefaultLoginTTL.String())
	return nil
}
