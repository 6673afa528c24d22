// Command bothyd-runtime is the sandbox side of bothyd: the runtime's shim, and the
// sandbox's init and agent, which bothyd starts for every sandbox. It is optional: without
// it bothyd re-executes itself for these roles, so that one binary is enough. With it
// installed beside bothyd, every sandbox start is faster, because this binary links none of
// the server's packages (the HTTP stack, the request validator, the metrics), whose package
// initialisers would otherwise run in each of a start's two or three processes.
//
// It is not meant to be run by hand.
package main

import (
	"fmt"
	"os"

	vmshim "github.com/bothy/bothy/runtime/microvm/shim"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

func main() {
	if code, ran := shim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	if code, ran := vmshim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	fmt.Fprintln(os.Stderr, "bothyd-runtime is started by bothyd for each sandbox; it is not run by hand.")
	os.Exit(2)
}
