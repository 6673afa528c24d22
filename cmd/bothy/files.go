package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// remotePath splits ID:/path; ok is false for a local path. A local path with a colon can be
// given as ./a:b, since an id has no slash.
func remotePath(arg string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return id, p, true
}

func (c *cli) cpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox (ID:/path on one side, as docker cp)",
		Long: `Copy one regular file between this host and a sandbox, streamed both ways. One side is
ID:/absolute/path in the sandbox; the other is a local path, or "-" for stdin or stdout. A
destination that is a directory (a local one, or a remote path ending in "/") gets the
source's name. Directories are not copied (the API moves files one at a time).`,
		Example: `  bothy cp ./input.txt demo:/home/user/input.txt
  bothy cp demo:/home/user/out.txt .
  tar c dir | bothy cp - demo:/tmp/dir.tar`,
		Args: exactArgs(2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := remotePath(args[0])
			dstID, dstPath, dstRemote := remotePath(args[1])
			switch {
			case srcRemote && dstRemote:
				return usagef("cp copies between this host and a sandbox, not between two sandboxes")
			case !srcRemote && !dstRemote:
				return usagef("one of SRC and DST must be ID:/path in a sandbox")
			case dstRemote:
				if strings.HasSuffix(dstPath, "/") {
					if args[0] == "-" {
						return usagef("a copy from stdin needs a file name in the sandbox, not the directory %s", dstPath)
					}
					dstPath += filepath.Base(args[0])
				}
				return c.upload(dstID, args[0], dstPath)
			default:
				return c.download(srcID, srcPath, args[1])
			}
		}),
	}
}

func (c *cli) upload(id, local, remote string) error {
	api, err := c.client()
	if err != nil {
		return err
	}
	in := c.stdin
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.IsDir() {
			return usagef("%s is a directory; cp copies files (tar it and copy the archive)", local)
		}
		in = f
	}
	ctx, cancel := c.context()
	defer cancel()
	return api.WriteFile(ctx, id, remote, in)
}

func (c *cli) download(id, remote, local string) error {
	return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
		r, err := api.ReadFile(ctx, id, remote)
		if err != nil {
			return err
		}
		defer r.Close()
		if local == "-" {
			_, err = io.Copy(c.stdout, r)
			return err
		}
		if st, err := os.Stat(local); err == nil && st.IsDir() {
			local = filepath.Join(local, path.Base(remote))
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		// Written beside the target and renamed, so that a copy cut short leaves no half file.
		tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".bothy-*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		if _, err := io.Copy(tmp, r); err != nil {
			tmp.Close()
			return fmt.Errorf("copying %s:%s: %w", id, remote, err)
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), local)
	})
}

// putCommand and fetchCommand are the copies of bothy before cp, hidden from help.
func (c *cli) putCommand() *cobra.Command {
	return &cobra.Command{
		Use: "put ID LOCAL REMOTE", Short: "Copy a file in (use cp)", Hidden: true, Args: exactArgs(3),
		RunE: runE(func(cmd *cobra.Command, args []string) error { return c.upload(args[0], args[1], args[2]) }),
	}
}

func (c *cli) fetchCommand() *cobra.Command {
	return &cobra.Command{
		Use: "fetch ID REMOTE LOCAL", Short: "Copy a file out (use cp)", Hidden: true, Args: exactArgs(3),
		RunE: runE(func(cmd *cobra.Command, args []string) error { return c.download(args[0], args[1], args[2]) }),
	}
}
