package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInstalledToken: with no root named and no .bothy/token in the current directory, the
// CLI takes the installed server's token; .bothy/token, when there, comes first, and a root
// named is the only one read.
func TestInstalledToken(t *testing.T) {
	installed := t.TempDir()
	if err := os.WriteFile(filepath.Join(installed, "token"), []byte("installed-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := installedRoot
	installedRoot = installed
	t.Cleanup(func() { installedRoot = old })
	t.Chdir(t.TempDir())
	t.Setenv("BOTHY_ROOT", "")
	t.Setenv("BOTHY_TOKEN", "")
	t.Setenv("BOTHY_TOKEN_FILE", "")

	if got, err := (&cli{}).readToken(); err != nil || got != "installed-token-0123456789" {
		t.Fatalf("no .bothy: token %q, %v; want the installed one", got, err)
	}
	if err := os.Mkdir(".bothy", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(".bothy/token", []byte("local-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := (&cli{}).readToken(); err != nil || got != "local-token-0123456789" {
		t.Fatalf("with .bothy: token %q, %v; want the local one", got, err)
	}
	if got, err := (&cli{root: t.TempDir()}).readToken(); err != nil || got != "" {
		t.Fatalf("--root without a token: %q, %v; want no token", got, err)
	}
}
