package supervisor

import (
	"slices"

	"github.com/sandboxd/sandboxd/supervisor/agent"
	"github.com/sandboxd/sandboxd/supervisor/runtime/namespace"
)

// RunHidden runs the hidden sub-commands that the runtime re-executes sandboxd as (the shim,
// and the sandbox's init, which becomes the agent), if args names one. Every binary that
// launches sandboxes (sandboxd, and test binaries that re-execute themselves) calls it first
// thing in main or TestMain.
func RunHidden(args []string) (code int, ran bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case namespace.ShimCommand:
		return namespace.ShimMain(args[1:]), true
	case namespace.InitCommand:
		namespace.RunAgent = runAgent
		return namespace.InitMain(args[1:]), true
	}
	return 0, false
}

// runAgent runs the agent as the sandbox's PID 1.
func runAgent(c namespace.AgentConfig) error {
	env := make([]string, 0, len(c.Env))
	for k, v := range c.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return agent.Run(agent.Config{
		ListenPath: c.ListenPath,
		Capability: c.Capability,
		DefaultEnv: env,
		Hostname:   c.Hostname,
		CgroupDir:  c.CgroupDir,
		ReapAll:    true,
	})
}
