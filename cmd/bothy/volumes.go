package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// volumeMounts parses repeated --volume NAME:/PATH[:ro] flags.
func volumeMounts(specs []string) ([]bothy.VolumeMount, error) {
	var out []bothy.VolumeMount
	for _, s := range specs {
		parts := strings.Split(s, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
			return nil, usagef("--volume %q is not NAME:/PATH or NAME:/PATH:ro", s)
		}
		m := bothy.VolumeMount{Name: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				ro := true
				m.ReadOnly = &ro
			case "rw":
			default:
				return nil, usagef("--volume %q: the mode after the path is ro or rw", s)
			}
		}
		out = append(out, m)
	}
	return out, nil
}

func (c *cli) volumeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes"},
		Short:   "Create, list, inspect and delete volumes, file systems that sandboxes share and that outlive them",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("volume needs a subcommand: create, ls, inspect or rm")
		}),
	}
	cmd.AddCommand(c.volumeCreateCommand(), c.volumeListCommand(), c.volumeInspectCommand(), c.volumeRemoveCommand())
	return cmd
}

func (c *cli) volumeCreateCommand() *cobra.Command {
	var size string
	cmd := &cobra.Command{
		Use:   "create NAME [--size 2g]",
		Short: "Make a volume and print its name",
		Long: `Make a volume: a file system of --size (default 1g) that sandboxes mount with
bothy create --volume NAME:/PATH, several at once, and that outlives them (docs/volumes.md).`,
		Example: `  bothy volume create cache --size 4g
  bothy create worker --start --volume cache:/cache`,
		Args: exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			mb, err := mebibytes("--size", size)
			if err != nil {
				return err
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				v, err := api.CreateVolume(ctx, args[0], mb)
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, v.Name)
				return nil
			})
		}),
	}
	cmd.Flags().StringVar(&size, "size", "", "the volume's size (512m, 4g; a plain number is MiB; default 1g)")
	return cmd
}

func (c *cli) volumeListCommand() *cobra.Command {
	return listCommand(c, listing[bothy.Volume]{
		cmd: &cobra.Command{
			Use:   "ls",
			Short: "List volumes, their size and use, and the sandboxes that mount them",
			Args:  cobra.NoArgs,
		},
		fetch: func(ctx context.Context, api *bothy.Client, _ []string) ([]bothy.Volume, error) {
			return api.Volumes(ctx)
		},
		name:   func(v bothy.Volume) string { return v.Name },
		header: "NAME\tSIZE\tUSED\tSANDBOXES\tCREATED",
		row: func(v bothy.Volume) string {
			return fmt.Sprintf("%s\t%dMiB\t%dMiB\t%s\t%s", v.Name, v.SizeMb, v.UsedBytes>>20, orDash(strings.Join(v.Sandboxes, ",")), v.CreatedAt.Format("2006-01-02 15:04"))
		},
	})
}

func (c *cli) volumeInspectCommand() *cobra.Command {
	return inspectCommand(c, "inspect NAME", "Print a volume as JSON", (*bothy.Client).GetVolume)
}

func (c *cli) volumeRemoveCommand() *cobra.Command {
	return removeCommand(c, "rm NAME...", "Delete volumes and their files; one that a sandbox mounts is refused", (*bothy.Client).DeleteVolume)
}
