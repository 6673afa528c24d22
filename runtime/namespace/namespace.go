package namespace

import (
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// Kind is this runtime's kind.
const Kind = "namespace"

// declaredEntries lists the names the runtime keeps in a state directory.
func declaredEntries() []runtime.Entry {
	return []runtime.Entry{
		{Name: shim.EntryControl, Dir: true},
		{Name: shim.EntryUpper, Dir: true},
		{Name: shim.EntryWork, Dir: true},
		{Name: shim.EntryRootfs, Dir: true},
		{Name: shim.EntryBase, Dir: true},
		{Name: shim.EntryHostFiles, Dir: true},
		{Name: shim.EntryLog},
		{Name: shim.EntryDisk, Dir: true},
		{Name: shim.EntryDiskImage},
	}
}
