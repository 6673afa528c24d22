//go:build linux

package seccomp

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
)

// What the kernel takes to install the default filter (checking it, compiling it, and
// working out which system calls it always allows), as every sandbox's init does once. Each
// iteration loads it on a fresh thread that then ends, so every load starts unfiltered:
//
//	go test ./runtime/namespace/seccomp -run '^$' -bench LoadDefault
func BenchmarkLoadDefault(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: a filter without no_new_privs needs CAP_SYS_ADMIN")
	}
	prog, err := Default(platform.DefaultCapabilities)
	if err != nil {
		b.Fatal(err)
	}
	allowAll, err := platform.NewSeccompProgram([]unix.SockFilter{{Code: bpfRetK, K: unix.SECCOMP_RET_ALLOW}})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		prog *platform.SeccompProgram
	}{{"default", prog}, {"allow-all", allowAll}} { // the second: what the thread costs
		b.Run(bc.name, func(b *testing.B) {
			errs := make(chan error)
			for b.Loop() {
				go func() {
					runtime.LockOSThread() // never unlocked: the thread, and its filter, end with it
					errs <- bc.prog.LoadThread()
				}()
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(bc.prog.Len()), "instructions")
		})
	}
}
