package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bothy/bothy/sdk/go/bothy"
)

func (c *cli) imageCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images"},
		Short:   "Pull, import, list and delete images",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("image needs a subcommand: pull, import, ls or rm")
		}),
	}
	cmd.AddCommand(c.pullCommand(), c.imageImportCommand(), c.imageListCommand(), c.imageRemoveCommand())
	return cmd
}

// pullCommand is `image pull`, and `pull` at the top as docker has it.
func (c *cli) pullCommand() *cobra.Command {
	var o bothy.PullOptions
	var quiet bool
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from a registry, showing its progress, and print its name",
		Long: `Pull an image from a registry and wait for the pull to end. On a terminal a progress bar
shows the bytes of the layers; otherwise a line is printed as each layer completes. The
image's name (--name, else one the server makes from the reference) is printed at the end.
Interrupting bothy does not stop the pull: the server goes on with it.`,
		Example: `  bothy image pull registry.example.com/library/busybox:1.36 --name busybox
  bothy pull localhost:5000/tools@sha256:3f1c...`,
		Args: exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				img, err := api.PullImage(ctx, args[0], o)
				if err != nil {
					return err
				}
				var show func(*bothy.Image)
				if !quiet {
					show = c.pullProgress(img.Name)
				}
				img, err = api.WaitImage(ctx, img.Name, show)
				if show != nil {
					c.endProgress()
				}
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, img.Name)
				return nil
			})
		}),
	}
	cmd.Flags().StringVar(&o.Name, "name", "", "the image's local name (default: the repository's last element, and -TAG unless latest)")
	cmd.Flags().StringVar(&o.Platform, "platform", "", "os/arch[/variant]; only the server's own is accepted")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "show no progress; print only the name")
	return cmd
}

// onTerminal reports whether w is a terminal, where progress is redrawn in place.
func onTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// pullProgress returns the reporter of a pull's readings, on stderr: a bar redrawn in place
// on a terminal, else one line per layer as it completes (and when the layers are known).
func (c *cli) pullProgress(name string) func(*bothy.Image) {
	tty := onTerminal(c.stderr)
	c.progressDrawn = false
	reported := -1
	var lastTotal int64
	return func(img *bothy.Image) {
		done, total, layersDone, layers := bothy.PullProgress(img)
		if total > 0 {
			lastTotal = total
		}
		// A ready image shows no bytes per layer: it is whole, at the size last seen.
		if img.State == bothy.ImageReady {
			done, total = lastTotal, lastTotal
		}
		if tty {
			fmt.Fprintf(c.stderr, "\r\x1b[K%s", progressBar(name, done, total, layersDone, layers))
			c.progressDrawn = true
			return
		}
		if layers == 0 || layersDone == reported {
			return
		}
		if reported < 0 {
			fmt.Fprintf(c.stderr, "%s: %d layers\n", name, layers)
		}
		if layersDone > reported && layersDone > 0 {
			line := fmt.Sprintf("%s: %d/%d layers done", name, layersDone, layers)
			if total > 0 {
				line += fmt.Sprintf(", %s of %s", size(done), size(total))
			}
			fmt.Fprintln(c.stderr, line)
		}
		reported = layersDone
	}
}

// endProgress ends a bar drawn in place, so that what follows starts on a line of its own.
func (c *cli) endProgress() {
	if c.progressDrawn {
		fmt.Fprintln(c.stderr)
		c.progressDrawn = false
	}
}

const barWidth = 30

// progressBar is one line: the name, a bar of the bytes, the bytes and the layers.
func progressBar(name string, done, total int64, layersDone, layers int) string {
	filled := 0
	if total > 0 {
		filled = int(min(done, total) * barWidth / total)
	}
	bar := strings.Repeat("=", filled)
	if filled < barWidth {
		bar += ">" + strings.Repeat(" ", barWidth-filled-1)
	}
	return fmt.Sprintf("%s [%s] %s/%s  %d/%d layers", name, bar, size(done), knownSize(total), layersDone, layers)
}

func knownSize(n int64) string {
	if n <= 0 {
		return "?"
	}
	return size(n)
}

func (c *cli) imageImportCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "import NAME FILE",
		Short: "Import a docker save archive or an OCI layout tarball (FILE - for stdin) as the image NAME",
		Example: `  docker save busybox:1.36 -o busybox.tar && bothy image import busybox busybox.tar
  scripts/image-debian | bothy image import debian-python -`,
		Args: exactArgs(2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			r := c.stdin
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				img, err := api.ImportImage(ctx, args[0], r)
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, img.Name)
				return nil
			})
		}),
	}
}

func (c *cli) imageListCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images: host, directories under the state root's images/, and OCI images",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				list, err := api.Images(ctx)
				if err != nil {
					return err
				}
				if done, err := printListShort(c, output, list, func(img bothy.Image) string { return img.Name }); done {
					return err
				}
				return c.imageTable(list, output == "wide")
			})
		}),
	}
	outputFlag(cmd, &output, "table", "json", "wide", "name")
	return cmd
}

func (c *cli) imageTable(list []bothy.Image, wide bool) error {
	tw := c.table()
	head := "NAME\tKIND\tSTATE\tSIZE\tCREATED"
	if wide {
		head += "\tDIGEST\tREF\tUSED BY"
	}
	fmt.Fprintln(tw, head)
	for _, img := range list {
		sz, created := "-", "-"
		if img.SizeBytes != nil {
			sz = size(*img.SizeBytes)
		}
		if img.CreatedAt != nil {
			created = ago(*img.CreatedAt)
		}
		state := string(img.State)
		switch img.State {
		case bothy.ImageFailed:
			state = c.paintOut(red, state)
		case bothy.ImagePulling:
			state = c.paintOut(yellow, state)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", img.Name, img.Kind, state, sz, created)
		if wide {
			used := "-"
			if img.UsedBy != nil && len(*img.UsedBy) > 0 {
				used = strings.Join(*img.UsedBy, ", ")
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s", orDashPtr(img.Digest), orDashPtr(img.Ref), used)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// orDash is s, or "-" for an empty column.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// orDashPtr is *s, or "-" for nil or empty.
func orDashPtr(s *string) string {
	if s == nil {
		return "-"
	}
	return orDash(*s)
}

func (c *cli) imageRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete", "rmi"},
		Short:   "Delete OCI images (refused with image-in-use while a sandbox or a generation uses one)",
		Args:    minArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				var failed error
				for _, name := range args {
					if err := api.DeleteImage(ctx, name); err != nil {
						if len(args) == 1 {
							return err
						}
						fmt.Fprintf(c.stderr, "%s %s: %v\n", c.paint(red, "error:"), name, err)
						failed = errors.New("not every image could be deleted; see above")
						continue
					}
					fmt.Fprintln(c.stdout, name)
				}
				return failed
			})
		}),
	}
}
