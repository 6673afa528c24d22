//go:build linux

package namespace

import (
	"bufio"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/platform"
)

// testCgroupParent keeps the tests' cgroups apart from a real sandboxd's.
const testCgroupParent = "sandboxd-test"

// TestMain dispatches the hidden sub-commands, as cmd/sandboxd does, so that the runtime
// re-executes this test binary as shim and init; then it runs the tests and checks that
// nothing was left behind.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case ShimCommand:
			os.Exit(ShimMain(os.Args[2:]))
		case InitCommand:
			RunAgent = standInAgent
			os.Exit(InitMain(os.Args[2:]))
		}
	}
	code := m.Run()
	if code == 0 && os.Geteuid() == 0 {
		if err := checkNoLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "leak check:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testRoots are the state roots the tests made, for the leak check.
var testRoots []string

// checkNoLeaks checks that no runtime process, cgroup or mount of the tests remains.
func checkNoLeaks() error {
	rt := &Runtime{cfg: Config{Executable: "/proc/self/exe", CgroupParent: testCgroupParent}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var problems []string
		for _, root := range testRoots {
			procs, err := rt.Processes(root)
			if err != nil {
				return err
			}
			for _, p := range procs {
				problems = append(problems, fmt.Sprintf("%s %s of %s still runs", p.Role, p.ID, p.Dir))
			}
			mounts, err := platform.MountsUnder(root)
			if err != nil {
				return err
			}
			for _, m := range mounts {
				problems = append(problems, "mount left on the host: "+m)
			}
		}
		if cg, err := platform.OpenCgroup(testCgroupParent); err == nil {
			for _, d := range cg.Dirs() {
				ents, _ := os.ReadDir(d)
				for _, e := range ents {
					if e.IsDir() {
						problems = append(problems, "cgroup left: "+filepath.Join(d, e.Name()))
					}
				}
			}
			for _, d := range cg.Dirs() {
				_ = os.Remove(d)
			}
		}
		if len(problems) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s", strings.Join(problems, "; "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The stand-in agent speaks JSON lines over the control socket: just enough for these tests
// to look at the sandbox from inside until the real agent and its control client are linked.
type agentRequest struct {
	Capability []byte   `json:"capability"`
	Op         string   `json:"op"` // hello, exec, shutdown
	Argv       []string `json:"argv,omitempty"`
	UID        int      `json:"uid,omitempty"`
}

type agentResponse struct {
	OK     bool   `json:"ok"`
	Output string `json:"output,omitempty"`
	Code   int    `json:"code"`
	Signal int    `json:"signal,omitempty"`
	Err    string `json:"err,omitempty"`
}

func standInAgent(cfg AgentConfig) error {
	ln, err := net.Listen("unix", cfg.ListenPath)
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				enc := json.NewEncoder(c)
				for sc.Scan() {
					var req agentRequest
					if err := json.Unmarshal(sc.Bytes(), &req); err != nil || subtle.ConstantTimeCompare(req.Capability, cfg.Capability) != 1 {
						return
					}
					switch req.Op {
					case "hello":
						_ = enc.Encode(agentResponse{OK: true})
					case "exec":
						cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
						cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
						cmd.Dir = "/"
						if req.UID != 0 {
							cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(req.UID), Gid: uint32(req.UID)}}
							cmd.Dir = userHome
						}
						out, err := cmd.CombinedOutput()
						resp := agentResponse{OK: true, Output: string(out)}
						if cmd.ProcessState != nil {
							resp.Code = cmd.ProcessState.ExitCode()
							if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
								resp.Signal = int(ws.Signal())
							}
						} else if err != nil {
							resp = agentResponse{Err: err.Error()}
						}
						_ = enc.Encode(resp)
					case "shutdown":
						_ = enc.Encode(agentResponse{OK: true})
						close(done)
						return
					}
				}
			}()
		}
	}()
	<-done
	return nil
}
