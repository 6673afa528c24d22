package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
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
	case o.tokenFile != "":
		token, err = readToken(o.tokenFile, log)
		return token, "file", err
	case o.insecureNoAuth:
		log.Warn("serving without a token (--insecure-no-auth): any user of this host can drive sandboxes as the user bothyd runs as")
		return "", "none", nil
	}
	token, err = generatedToken(o.root, log)
	return token, "generated", err
}

// generatedToken returns the token in <root>/token, making it first if there is none. Only
// the user that runs bothyd can read it (mode 0600, in a root of mode 0700), so that only
// that user, and whom they give it to, can drive the server.
//
// The token is written whole to a temporary file, synced, and then linked to its name, which
// fails if the name exists: a crash leaves either no token or a whole one, never an empty
// file, and two servers started at once on one root agree on one token.
func generatedToken(root string, log *slog.Logger) (string, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("creating the state root for its token: %w", err)
	}
	path := filepath.Join(root, tokenFileName)
	token, err := readGeneratedToken(path, log)
	if !errors.Is(err, fs.ErrNotExist) {
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
		return readGeneratedToken(path, log)
	} else if err != nil {
		return "", fmt.Errorf("writing the token: %w", err)
	}
	if err := syncDir(root); err != nil {
		return "", fmt.Errorf("writing the token: %w", err)
	}
	log.Info("generated an API token", "path", path)
	return token, nil
}

// readGeneratedToken reads the token file that bothyd made. It refuses a link or another
// kind of file, and a file that another user owns, which could hold a token someone else
// chose.
func readGeneratedToken(path string, log *slog.Logger) (string, error) {
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
	if st.Mode().Perm()&0o077 != 0 {
		log.Warn("the token file is readable by other users, who can then drive sandboxes; chmod 600 it unless you meant to share it", "path", path)
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
