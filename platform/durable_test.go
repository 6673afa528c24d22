package platform

import (
	"strings"
	"testing"
)

func TestTempNameRoundTrip(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"config.json", "a", "outcome.json", "x.tmp", ".hidden"} {
		tmp := TempName(name)
		if !strings.HasPrefix(tmp, "."+name+".") || !strings.HasSuffix(tmp, ".tmp") {
			t.Errorf("TempName(%q) = %q, not of the form .<name>.<random>.tmp", name, tmp)
		}
		got, ok := IsTempName(tmp)
		if !ok || got != name {
			t.Errorf("IsTempName(%q) = %q, %v; want %q, true", tmp, got, ok, name)
		}
		if TempName(name) == tmp {
			t.Errorf("TempName(%q) returned the same name twice", name)
		}
	}
}

func TestIsTempNameRefusesOtherForms(t *testing.T) {
	t.Parallel()
	for _, entry := range []string{
		"config.json",
		".config.json.tmp",                    // no random part
		".config.json.0123456789abcde.tmp",    // 15 digits
		".config.json.0123456789abcdef0.tmp",  // 17 digits
		".config.json.0123456789ABCDEF.tmp",   // uppercase
		".config.json-0123456789abcdef.tmp",   // no dot before the random part
		"..0123456789abcdef.tmp",              // empty name
		"config.json.0123456789abcdef.tmp",    // no leading dot
		".config.json.0123456789abcdef.tmp.x", // trailing junk
		".config.json.0123456789abcdeg.tmp",   // not hex
		"...0123456789abcdef.tmp",             // name "."
	} {
		if name, ok := IsTempName(entry); ok {
			t.Errorf("IsTempName(%q) = %q, true; want false", entry, name)
		}
	}
}
