package runtime

import (
	"strings"
	"testing"
)

func TestSpecValidate(t *testing.T) {
	t.Parallel()
	good := func() Spec {
		return Spec{
			ID: "sb-1", Dir: "/var/lib/bothy/sandboxes/sb-1", LaunchID: "l1",
			ImageDir: "/var/lib/bothy/images/base", HostBase: "/var/lib/bothy/host",
			Lowers:     []string{"/var/lib/bothy/templates/t/g000001/payload"},
			Capability: []byte("secret"),
		}
	}
	tests := []struct {
		name   string
		change func(*Spec)
		want   string // "" when valid
	}{
		{"valid", func(*Spec) {}, ""},
		{"built-in image, no host base, no layers", func(s *Spec) { s.ImageDir, s.HostBase, s.Lowers = "", "", nil }, ""},
		{"63-character id", func(s *Spec) { s.ID = strings.Repeat("a", 63) }, ""},
		{"empty id", func(s *Spec) { s.ID = "" }, `runtime: sandbox id "" must be 1-63 characters`},
		{"64-character id", func(s *Spec) { s.ID = strings.Repeat("a", 64) }, "must be 1-63 characters"},
		{"id with a leading dash", func(s *Spec) { s.ID = "-a" }, `runtime: sandbox id "-a" must be a-z 0-9 - starting with a letter or digit`},
		{"id with a slash", func(s *Spec) { s.ID = "a/b" }, "must be a-z 0-9 - starting with a letter or digit"},
		{"id checked before paths", func(s *Spec) { s.ID, s.Dir = "A", "" }, "sandbox id"},
		{"relative state directory", func(s *Spec) { s.Dir = "sandboxes/sb-1" }, `runtime: state directory "sandboxes/sb-1" must be a clean absolute path`},
		{"unclean state directory", func(s *Spec) { s.Dir = "/var/lib/../sb-1" }, "runtime: state directory"},
		{"unclean image directory", func(s *Spec) { s.ImageDir = "/images/" }, `runtime: image directory "/images/" must be a clean absolute path`},
		{"relative host base", func(s *Spec) { s.HostBase = "host" }, `runtime: host base directory "host" must be a clean absolute path`},
		{"relative layer", func(s *Spec) { s.Lowers = append(s.Lowers, "payload") }, `runtime: layer "payload" must be a clean absolute path`},
		{"no capability", func(s *Spec) { s.Capability = nil }, "runtime: the launch has no capability"},
		{"no launch id", func(s *Spec) { s.LaunchID = "" }, "runtime: the launch has no id"},
		{"negative pids", func(s *Spec) { s.Resources.Pids = -1 }, "runtime: negative resources"},
		{"negative disk", func(s *Spec) { s.DiskMB = -1 }, "runtime: negative resources"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := good()
			tt.change(&s)
			err := s.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v; want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v; want an error with %q", err, tt.want)
			}
		})
	}
}
