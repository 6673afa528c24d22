package supervisor

import (
	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// Declaration is a name that the supervisor declares to the store, with its kind.
type Declaration struct {
	Name string
	Kind store.EntryKind
}

// DeclaredEntries are the names that [New] declares to the store for a supervisor over rts,
// each once: the supervisor's own ([ExecLockName], [CapabilityName], [LogName]), the clone
// binding ([template.BindingFile]), the lifecycle's records ([PendingName], [LifetimeName],
// [PausedName], [RestoreName]), and the union of rts' [runtime.Runtime.DeclaredEntries]. The
// consistency checker asks it what a state directory may hold besides the store's records.
func DeclaredEntries(rts ...runtime.Runtime) []Declaration {
	var out []Declaration
	seen := map[string]bool{}
	add := func(name string, kind store.EntryKind) {
		if !seen[name] {
			seen[name] = true
			out = append(out, Declaration{Name: name, Kind: kind})
		}
	}
	for _, name := range []string{ExecLockName, CapabilityName, template.BindingFile, LogName, PendingName, LifetimeName, PausedName, RestoreName, ActivityName} {
		add(name, store.EntryFile)
	}
	add(ImageFilesName, store.EntryDir)
	add(checkpoint.DirName, store.EntryDir)
	for _, rt := range rts {
		for _, e := range rt.DeclaredEntries() {
			kind := store.EntryFile
			if e.Dir {
				kind = store.EntryDir
			}
			add(e.Name, kind)
		}
	}
	return out
}
