package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

func (c *cli) createCommand() *cobra.Command {
	var o bothy.CreateOptions
	var cpus, pids int
	var memory, disk, output string
	var labels, env, vols []string
	var lifetime, idleTimeout time.Duration
	var noWake, ignoreWork bool
	cmd := &cobra.Command{
		Use:   "create [ID]",
		Short: "Create a sandbox (from an image, or a clone of a template) and print its id",
		Example: `  bothy create demo --start --memory 512m --label team=grading
  bothy create --template tools --start
  bothy create job1 --env CI=true --timeout 1h
  bothy create web --start --idle-timeout 10m
  bothy create worker --start --volume cache:/cache --volume refs:/refs:ro`,
		Args: cobra.MaximumNArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if o.ID != "" && o.ID != args[0] {
					return usagef("the id is given twice: %s and --id %s", args[0], o.ID)
				}
				o.ID = args[0]
			}
			var err error
			if o.Labels, err = keyValues("--label", labels); err != nil {
				return err
			}
			for _, e := range env {
				if !strings.Contains(e, "=") {
					return usagef("--env %q is not KEY=VALUE", e)
				}
			}
			o.Env = env
			if o.Volumes, err = volumeMounts(vols); err != nil {
				return err
			}
			res := bothy.ResourcesRequest{Vcpus: cpus, Pids: pids}
			if res.MemoryMb, err = mebibytes("--memory", memory); err != nil {
				return err
			}
			if res.DiskMb, err = mebibytes("--disk", disk); err != nil {
				return err
			}
			if res != (bothy.ResourcesRequest{}) {
				o.Resources = &res
			}
			if lifetime > 0 {
				o.TimeoutS = int(lifetime.Round(time.Second) / time.Second)
			}
			if idleTimeout > 0 {
				o.Sleep = &bothy.SleepOptions{IdleTimeoutS: max(1, int(idleTimeout.Round(time.Second)/time.Second)), NoAutoResume: noWake, IgnoreWork: ignoreWork}
			} else if noWake || ignoreWork {
				return usagef("--no-wake and --idle-ignores-work need --idle-timeout")
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				sb, err := api.Create(ctx, o)
				if err != nil {
					return err
				}
				if output == "json" {
					return c.printJSON(sb)
				}
				fmt.Fprintln(c.stdout, sb.ID)
				return nil
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.ID, "id", "", "the sandbox id (the argument ID does the same)")
	_ = f.MarkHidden("id")
	f.StringVar(&o.Image, "image", "", "the image (default host)")
	f.StringVar(&o.Template, "template", "", "clone the sandbox from this template")
	f.StringVar(&o.Generation, "generation", "", "the template's generation to clone (default the newest eligible one)")
	f.IntVar(&cpus, "cpus", 0, "CPUs")
	f.StringVar(&memory, "memory", "", "memory limit (512m, 2g; a plain number is MiB)")
	f.StringVar(&disk, "disk", "", "a disk of its own bounding what it writes (4g; a plain number is MiB)")
	f.IntVar(&pids, "pids", 0, "process limit")
	f.StringArrayVarP(&labels, "label", "l", nil, "a label KEY=VALUE (repeatable)")
	f.StringArrayVarP(&env, "env", "e", nil, "an environment variable KEY=VALUE (repeatable)")
	f.StringArrayVarP(&vols, "volume", "v", nil, "mount a volume NAME:/PATH, or NAME:/PATH:ro read-only (repeatable; bothy volume create makes one)")
	f.DurationVar(&lifetime, "timeout", 0, "the sandbox's lifetime (1h, 30m); it is stopped when it ends")
	f.StringVar(&o.OnTimeout, "on-timeout", "", "what the end of --timeout does: stop (default) or delete")
	f.DurationVar(&idleTimeout, "idle-timeout", 0, "sleep (pause) once unused this long (10m); the next exec, file call or port request wakes it")
	f.BoolVar(&noWake, "no-wake", false, "with --idle-timeout: a request does not wake it; resume it yourself")
	f.BoolVar(&ignoreWork, "idle-ignores-work", false, "with --idle-timeout: sleep even while work inside uses the CPU")
	f.BoolVar(&o.Start, "start", false, "start it too")
	outputFlag(cmd, &output, "id", "json")
	return cmd
}

// keyValues parses repeated KEY=VALUE flags into a map.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("%s %q is not KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// mebibytes parses a size as docker does (512m, 2g, 1024k) into MiB; a plain number is MiB.
func mebibytes(flag, s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	lower := strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(s), "ib"), "b"))
	mult := 1.0
	switch {
	case strings.HasSuffix(lower, "k"):
		mult, lower = 1.0/1024, strings.TrimSuffix(lower, "k")
	case strings.HasSuffix(lower, "m"):
		lower = strings.TrimSuffix(lower, "m")
	case strings.HasSuffix(lower, "g"):
		mult, lower = 1024, strings.TrimSuffix(lower, "g")
	case strings.HasSuffix(lower, "t"):
		mult, lower = 1024*1024, strings.TrimSuffix(lower, "t")
	}
	n, err := strconv.ParseFloat(lower, 64)
	if err != nil || n <= 0 {
		return 0, usagef("%s %q is not a size (512m, 2g, or MiB)", flag, s)
	}
	return int(n*mult + 0.5), nil
}

func (c *cli) listCommand() *cobra.Command {
	var o bothy.ListOptions
	var state, output string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"ps", "list"},
		Short:   "List sandboxes",
		Example: `  bothy ls
  bothy ps --state running -l team=grading -o wide
  bothy ls -o name | xargs -n1 bothy stop`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			o.State = bothy.SandboxState(state)
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				list, err := api.List(ctx, o)
				if err != nil {
					return err
				}
				return c.printSandboxes(list, output)
			})
		}),
	}
	cmd.Flags().StringArrayVarP(&o.Labels, "label", "l", nil, "only sandboxes with this label KEY=VALUE (repeatable; all must match)")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (provisioned, running, stopped, ...)")
	outputFlag(cmd, &output, "table", "wide", "json", "name")
	return cmd
}

func (c *cli) printSandboxes(list []bothy.Sandbox, output string) error {
	if done, err := printListShort(c, output, list, func(sb bothy.Sandbox) string { return sb.ID }); done {
		return err
	}
	tw := c.table()
	header := "ID\tSTATE\tIMAGE\tCREATED"
	if output == "wide" {
		header += "\tTEMPLATE\tCPUS\tMEMORY\tPIDS\tDISK\tLABELS"
	}
	fmt.Fprintln(tw, header)
	for _, sb := range list {
		source := sb.Image
		if sb.Template != nil {
			source = "-"
		}
		row := fmt.Sprintf("%s\t%s\t%s\t%s", sb.ID, c.paintOut(stateColor(sb.State), string(sb.State)), source, ago(sb.CreatedAt))
		if output == "wide" {
			tmpl := "-"
			if sb.Template != nil {
				tmpl = sb.Template.Template + "/" + sb.Template.Generation
			}
			r := sb.Resources
			disk := "-"
			if r.DiskMb > 0 {
				disk = strconv.Itoa(r.DiskMb) + "Mi"
			}
			row += fmt.Sprintf("\t%s\t%d\t%dMi\t%d\t%s\t%s", tmpl, r.Vcpus, r.MemoryMb, r.Pids, disk, labelString(sb.Labels))
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}

func stateColor(s bothy.SandboxState) string {
	switch s {
	case "running":
		return green
	case "starting", "stopping", "paused":
		return yellow
	default:
		return gray
	}
}

func labelString(l bothy.Labels) string {
	if len(l) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + l[k]
	}
	return strings.Join(keys, ",")
}

// ago is a time as docker shows it: how long ago, roughly.
func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd ago", int(d.Hours()/24))
	}
}

func (c *cli) inspectCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "inspect ID...",
		Aliases:           []string{"get"},
		Short:             "Show sandboxes as JSON (an array, as docker inspect does)",
		Args:              minArgs(1),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				out := []*bothy.Sandbox{}
				for _, id := range args {
					sb, err := api.Get(ctx, id)
					if err != nil {
						return err
					}
					out = append(out, sb)
				}
				return c.printJSON(out)
			})
		}),
	}
	return cmd
}

// transition is a command that does one thing to each of its sandboxes.
func (c *cli) transition(use, short string, f func(ctx context.Context, api *bothy.Client, id string) error) *cobra.Command {
	return &cobra.Command{
		Use:               use + " ID...",
		Short:             short,
		Args:              minArgs(1),
		ValidArgsFunction: c.completeSandboxes,
		RunE:              runE(func(cmd *cobra.Command, args []string) error { return c.each(args, f) }),
	}
}

func (c *cli) startCommand() *cobra.Command {
	var timeout time.Duration
	cmd := c.transition("start", "Start sandboxes and wait until they answer", func(ctx context.Context, api *bothy.Client, id string) error {
		_, err := api.Start(ctx, id, timeout)
		return err
	})
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait for another transition of the sandbox (default the server's)")
	return cmd
}

func (c *cli) stopCommand() *cobra.Command {
	var force bool
	var timeout time.Duration
	cmd := c.transition("stop", "Stop sandboxes (gracefully, or killed with -f)", func(ctx context.Context, api *bothy.Client, id string) error {
		_, err := api.Stop(ctx, id, force, timeout)
		return err
	})
	cmd.Flags().BoolVarP(&force, "force", "f", false, "kill instead of asking the sandbox to shut down")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long a graceful stop may take before it fails (default the server's)")
	return cmd
}

func (c *cli) rmCommand() *cobra.Command {
	var force bool
	cmd := c.transition("rm", "Delete stopped sandboxes (-f: running ones too, killed first)", func(ctx context.Context, api *bothy.Client, id string) error {
		return api.Delete(ctx, id, force)
	})
	cmd.Aliases = []string{"delete"}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "kill a running sandbox first")
	return cmd
}

func (c *cli) pauseCommand() *cobra.Command {
	return c.transition("pause", "Freeze every process of running sandboxes", func(ctx context.Context, api *bothy.Client, id string) error {
		_, err := api.Pause(ctx, id)
		return err
	})
}

func (c *cli) resumeCommand() *cobra.Command {
	return c.transition("resume", "Thaw paused sandboxes", func(ctx context.Context, api *bothy.Client, id string) error {
		_, err := api.Resume(ctx, id)
		return err
	})
}

func (c *cli) waitCommand() *cobra.Command {
	var state string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait until a sandbox is in a state (default stopped), and print the state",
		Example: `  bothy wait demo
  bothy wait demo --state running --timeout 30s
  bothy wait demo --state deleted`,
		Args:              exactArgs(1),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				sb, err := api.Wait(ctx, args[0], bothy.SandboxState(state), timeout)
				if err != nil {
					return err
				}
				if sb == nil {
					fmt.Fprintln(c.stdout, "deleted")
					return nil
				}
				fmt.Fprintln(c.stdout, sb.State)
				return nil
			})
		}),
	}
	cmd.Flags().StringVar(&state, "state", "stopped", "the state to wait for (running, paused, stopped, deleted, ...)")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "how long to wait")
	return cmd
}

func (c *cli) timeoutCommand() *cobra.Command {
	var onTimeout string
	cmd := &cobra.Command{
		Use:   "timeout ID DURATION",
		Short: "Set a sandbox's lifetime from now (0 clears it)",
		Example: `  bothy timeout demo 1h
  bothy timeout demo 10m --on-timeout delete
  bothy timeout demo 0`,
		Args:              exactArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if args[1] == "0" {
				d, err = 0, nil
			}
			if err != nil || d < 0 {
				return usagef("%q is not a duration (1h, 30m, 0)", args[1])
			}
			return c.each(args[:1], func(ctx context.Context, api *bothy.Client, id string) error {
				_, err := api.SetTimeout(ctx, id, d, onTimeout)
				return err
			})
		}),
	}
	cmd.Flags().StringVar(&onTimeout, "on-timeout", "", "what the lifetime's end does: stop (default) or delete")
	return cmd
}

func (c *cli) metricsCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:               "metrics ID",
		Short:             "Print what a running sandbox uses: CPU, memory, tasks, disk, network",
		Args:              exactArgs(1),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				m, err := api.Metrics(ctx, args[0])
				if err != nil {
					return err
				}
				if output == "json" {
					return c.printJSON(m)
				}
				u := m.Current
				rate := "-"
				if u.CPURate != nil {
					rate = fmt.Sprintf("%.2f", *u.CPURate)
				}
				fmt.Fprintf(c.stdout, "cpu       %.2f s (%s CPUs now)\n", u.CPUSeconds, rate)
				limit := "none"
				if u.MemoryLimitBytes != nil && *u.MemoryLimitBytes > 0 {
					limit = fmt.Sprintf("%.1f MiB", float64(*u.MemoryLimitBytes)/(1<<20))
				}
				fmt.Fprintf(c.stdout, "memory    %.1f MiB of %s\n", float64(u.MemoryBytes)/(1<<20), limit)
				fmt.Fprintf(c.stdout, "tasks     %d\n", u.Pids)
				if u.DiskUsedBytes != nil && u.DiskLimitBytes != nil {
					fmt.Fprintf(c.stdout, "disk      %.1f MiB of %.1f MiB\n", float64(*u.DiskUsedBytes)/(1<<20), float64(*u.DiskLimitBytes)/(1<<20))
				}
				if u.NetInBytes != nil && u.NetOutBytes != nil {
					fmt.Fprintf(c.stdout, "network   %d bytes in, %d out\n", *u.NetInBytes, *u.NetOutBytes)
				}
				fmt.Fprintf(c.stdout, "history   %d samples, %d ms apart\n", len(m.History), m.IntervalMs)
				return nil
			})
		}),
	}
	outputFlag(cmd, &output, "text", "json")
	return cmd
}

func (c *cli) logsCommand() *cobra.Command {
	var tail int
	cmd := &cobra.Command{
		Use:               "logs ID",
		Short:             "Print a sandbox's console log (the API has no follow mode, so there is no -f)",
		Args:              exactArgs(1),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				r, err := api.Logs(ctx, args[0], tail)
				if err != nil {
					return err
				}
				defer r.Close()
				_, err = io.Copy(c.stdout, r)
				return err
			})
		}),
	}
	cmd.Flags().IntVarP(&tail, "tail", "n", 0, "only the last N lines")
	return cmd
}
