package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretCLI: bothy secret creates, lists, inspects, rotates and deletes secrets, reading
// values from stdin or a file and never from its command line; nothing it prints, and
// nothing bothyd logs, holds a value. (That the value it stores is the one given, without the
// trailing line break, is held by TestSecretsAtEgressAcrossRestart, whose host receives it.)
func TestSecretCLI(t *testing.T) {
	const value = "sk-cli-0f8e7d6c5b4a39281706f5e4d3c2b1a0"
	const fileValue = "sk-cli-file-1a2b3c4d5e6f70819293a4b5c6d7e8f9"
	const rotated = "sk-cli-rotated-99aa88bb77cc66dd55ee44ff3300"
	d := startDaemon(t)
	var printed []string
	ok := func(stdin string, args ...string) string {
		t.Helper()
		out := d.ctlOK(stdin, args...)
		printed = append(printed, out)
		return out
	}

	if out := ok(value+"\n", "secret", "create", "CLI_KEY", "--value-stdin"); out != "CLI_KEY\n" {
		t.Fatalf("create from stdin: %q", out)
	}
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(fileValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := ok("", "secret", "create", "FILE_KEY", "--from-file", file); out != "FILE_KEY\n" {
		t.Fatalf("create from a file: %q", out)
	}

	// Typed on a terminal: asked for, and not echoed.
	const typed = "sk-cli-typed-4b3a2c1d0e9f8a7b6c5d"
	tm := d.startOnTerminal(t, 24, 80, "secret", "create", "TYPED_KEY", "--value-stdin")
	tm.waitFor("Value: ", "")
	tm.typeIn(typed + "\r")
	if code := tm.exit(); code != 0 {
		t.Fatalf("create typed on a terminal: exit %d:\n%s", code, tm.output())
	}
	if out := tm.output(); !strings.Contains(out, "TYPED_KEY") || strings.Contains(out, typed) {
		t.Fatalf("create typed on a terminal: want the name and no echo of the value:\n%q", out)
	}

	// No way to give the value on the command line, and no silent empty value.
	d.wantFail(2, "unknown flag: --value", "secret", "create", "ARGV_KEY", "--value", value)
	d.wantFail(2, "--value-stdin", "secret", "create", "ARGV_KEY")
	d.wantFail(2, "not both", "secret", "create", "ARGV_KEY", "--value-stdin", "--from-file", file)
	if _, stderr, code := d.ctl("\n", "secret", "create", "ARGV_KEY", "--value-stdin"); code != 2 || !strings.Contains(stderr, "empty") {
		t.Fatalf("an empty value: exit %d: %s", code, stderr)
	}
	d.wantFail(1, "no such file", "secret", "create", "ARGV_KEY", "--from-file", filepath.Join(t.TempDir(), "missing"))
	if _, stderr, code := d.ctl(value, "secret", "create", "CLI_KEY", "--value-stdin"); code != 1 || !strings.Contains(stderr, "exists") {
		t.Fatalf("a second create of CLI_KEY: exit %d: %s", code, stderr)
	}

	ls := ok("", "secret", "ls")
	if !strings.Contains(ls, "CLI_KEY") || !strings.Contains(ls, "FILE_KEY") || !strings.HasPrefix(ls, "NAME") {
		t.Fatalf("ls: %q", ls)
	}
	if out := ok("", "secret", "ls", "-o", "name"); out != "CLI_KEY\nFILE_KEY\nTYPED_KEY\n" {
		t.Fatalf("ls -o name: %q", out)
	}
	var s secretJSON
	d.ctlJSON(&s, "secret", "inspect", "CLI_KEY")
	if s.Name != "CLI_KEY" || s.CreatedAt.IsZero() || s.RotatedAt != nil {
		t.Fatalf("inspect: %+v", s)
	}

	if out := ok(rotated, "secret", "rotate", "CLI_KEY", "--value-stdin"); out != "CLI_KEY\n" {
		t.Fatalf("rotate: %q", out)
	}
	d.ctlJSON(&s, "secret", "inspect", "CLI_KEY")
	if s.RotatedAt == nil {
		t.Fatalf("inspect after the rotation has no rotated_at: %+v", s)
	}
	d.wantFail(1, "MISSING", "secret", "rotate", "MISSING", "--from-file", file)

	if out := ok("", "secret", "rm", "CLI_KEY", "FILE_KEY", "TYPED_KEY"); out != "CLI_KEY\nFILE_KEY\nTYPED_KEY\n" {
		t.Fatalf("rm: %q", out)
	}
	if out := ok("", "secret", "ls", "-o", "name"); out != "" {
		t.Fatalf("ls after rm: %q", out)
	}
	d.wantFail(1, "CLI_KEY", "secret", "inspect", "CLI_KEY")

	for _, v := range []string{value, fileValue, rotated, typed} {
		for _, out := range printed {
			if strings.Contains(out, v) {
				t.Errorf("bothy printed a value: %q", out)
			}
		}
		if strings.Contains(d.logs.String(), v) {
			t.Error("bothyd's log holds a value")
		}
	}
}
