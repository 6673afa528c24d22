package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

func (c *cli) infoCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "info",
		Short: "Show what the server runs and accepts: version, runtime, images, limits",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				info, err := api.Info(ctx)
				if err != nil {
					return err
				}
				if output == "json" {
					return c.printJSON(info)
				}
				images := make([]string, 0, len(info.Images))
				for _, im := range info.Images {
					images = append(images, im.Name)
				}
				l := info.Limits
				tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintf(tw, "Server:\t%s\n", api.URL())
				fmt.Fprintf(tw, "Version:\t%s\n", info.Version)
				fmt.Fprintf(tw, "Runtime:\t%s (%s)\n", info.Runtime.Kind, info.Runtime.Identity)
				fmt.Fprintf(tw, "Images:\t%s\n", strings.Join(images, ", "))
				fmt.Fprintf(tw, "Default resources:\t%s\n", resources(l.DefaultResources))
				fmt.Fprintf(tw, "Max resources:\t%s\n", resources(l.MaxResources))
				fmt.Fprintf(tw, "Max file:\t%s\n", size(l.MaxFileBytes))
				fmt.Fprintf(tw, "Max exec output:\t%s per stream (buffered exec)\n", size(l.MaxExecOutputBytes))
				return tw.Flush()
			})
		}),
	}
	outputFlag(cmd, &output, "text", "json")
	return cmd
}

func resources(r bothy.Resources) string {
	s := fmt.Sprintf("%d CPUs, %d MiB memory, %d pids", r.Vcpus, r.MemoryMb, r.Pids)
	if r.DiskMb > 0 {
		s += fmt.Sprintf(", %d MiB disk", r.DiskMb)
	}
	return s
}

// version is set at build time with -ldflags "-X main.version=...", as bothyd's is: the
// packages (scripts/package) give both the same.
var version string

// clientVersion is this build's version: the one set at build time, else the module version
// the Go toolchain recorded; with the VCS revision when it recorded one.
func clientVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if version != "" {
			return version
		}
		return "unknown"
	}
	v := bi.Main.Version
	if version != "" {
		v = version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " (" + s.Value[:12] + ")"
		}
	}
	return v
}

func (c *cli) versionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show the client's version and the server's",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			v := struct {
				Client string `json:"client"`
				Server string `json:"server,omitempty"`
			}{Client: clientVersion()}
			var serverErr error
			api, err := c.client()
			if err == nil {
				ctx, cancel := c.context()
				defer cancel()
				info, err := api.Info(ctx)
				if err == nil {
					v.Server = info.Version
				}
				serverErr = err
			} else {
				serverErr = err
			}
			if output == "json" {
				if err := c.printJSON(v); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(c.stdout, "Client: %s\n", v.Client)
				if v.Server != "" {
					fmt.Fprintf(c.stdout, "Server: %s\n", v.Server)
				}
			}
			return serverErr
		}),
	}
	outputFlag(cmd, &output, "text", "json")
	return cmd
}

func (c *cli) eventsCommand() *cobra.Command {
	var since, sandbox, output string
	var count int
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Follow lifecycle events as they happen (Ctrl-C ends)",
		Long: `Follow the server's lifecycle events. --since ID first replays the events after that id
that the server still holds (its last 1024); -n ends after that many events.`,
		Example: `  bothy events
  bothy events --sandbox demo -o json
  bothy events --since 41 -n 5`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				s, err := api.Events(ctx, since)
				if err != nil {
					return err
				}
				defer s.Close()
				enc := json.NewEncoder(c.stdout)
				for seen := 0; count == 0 || seen < count; {
					ev, err := s.Next()
					if err != nil {
						if ctx.Err() != nil || errors.Is(err, io.EOF) {
							return nil
						}
						return err
					}
					if sandbox != "" && (ev.Sandbox == nil || *ev.Sandbox != sandbox) {
						continue
					}
					seen++
					if output == "json" {
						if err := enc.Encode(ev); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintln(c.stdout, bothy.FormatEvent(ev))
				}
				return nil
			})
		}),
	}
	cmd.Flags().StringVar(&since, "since", "", "replay the events after this event id first")
	cmd.Flags().StringVar(&sandbox, "sandbox", "", "only the events of this sandbox")
	cmd.Flags().IntVarP(&count, "count", "n", 0, "end after this many events (0: follow until interrupted)")
	outputFlag(cmd, &output, "text", "json")
	return cmd
}
