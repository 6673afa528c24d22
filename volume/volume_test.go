package volume

import (
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
)

func TestCheckMounts(t *testing.T) {
	t.Parallel()
	many := make([]Mount, MaxMounts+1)
	for i := range many {
		many[i] = Mount{Name: "v", Path: "/m" + strings.Repeat("x", i+1)}
	}
	for _, c := range []struct {
		name   string
		mounts []Mount
		field  string // "" for accepted
	}{
		{"none", nil, ""},
		{"one", []Mount{{Name: "v", Path: "/data"}}, ""},
		{"one volume at two paths", []Mount{{Name: "v", Path: "/a"}, {Name: "v", Path: "/b", ReadOnly: true}}, ""},
		{"siblings that share a prefix", []Mount{{Name: "v", Path: "/data"}, {Name: "w", Path: "/data2"}}, ""},
		{"relative", []Mount{{Name: "v", Path: "data"}}, "volumes[0].path"},
		{"the root", []Mount{{Name: "v", Path: "/"}}, "volumes[0].path"},
		{"dot-dot", []Mount{{Name: "v", Path: "/data/../etc"}}, "volumes[0].path"},
		{"trailing slash", []Mount{{Name: "v", Path: "/data/"}}, "volumes[0].path"},
		{"double slash", []Mount{{Name: "v", Path: "//data"}}, "volumes[0].path"},
		{"NUL", []Mount{{Name: "v", Path: "/da\x00ta"}}, "volumes[0].path"},
		{"proc", []Mount{{Name: "v", Path: "/proc"}}, "volumes[0].path"},
		{"below sys", []Mount{{Name: "v", Path: "/sys/fs/x"}}, "volumes[0].path"},
		{"below dev", []Mount{{Name: "v", Path: "/dev/shm"}}, "volumes[0].path"},
		{"bothyd's run directory", []Mount{{Name: "v", Path: "/run/bothyd"}}, "volumes[0].path"},
		{"beside bothyd's run directory", []Mount{{Name: "v", Path: "/run/other"}}, ""},
		{"a name past the rule", []Mount{{Name: "V!", Path: "/data"}}, "volumes[0].name"},
		{"one inside another", []Mount{{Name: "v", Path: "/data"}, {Name: "w", Path: "/data/inner"}}, "volumes[1].path"},
		{"the same path twice", []Mount{{Name: "v", Path: "/data"}, {Name: "w", Path: "/data"}}, "volumes[1].path"},
		{"too many", many, "volumes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := CheckMounts("volumes", c.mounts)
			var e *errcode.Error
			switch {
			case c.field == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.field != "" && (err == nil || errcode.Of(err) != errcode.InvalidRequest):
				t.Fatalf("got %v, want invalid-request on %s", err, c.field)
			case c.field != "":
				e = err.(*errcode.Error)
				if e.Field != c.field {
					t.Fatalf("field %q, want %q (%s)", e.Field, c.field, e.Msg)
				}
			}
		})
	}
}
