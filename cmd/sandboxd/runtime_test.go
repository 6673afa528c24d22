package main

import (
	"flag"
	"io"
	"testing"
)

// TestRuntimeFlags: --user-namespaces defaults to true, takes SANDBOXD_USER_NAMESPACES as its
// default, and the flag wins over the environment; a malformed variable is an error. The
// server and `sandboxd check` both parse these flags through addRuntimeFlags.
func TestRuntimeFlags(t *testing.T) {
	for _, c := range []struct {
		name, env string
		args      []string
		want      bool
		wantErr   bool
	}{
		{name: "default", want: true},
		{name: "flag off", args: []string{"--user-namespaces=false"}, want: false},
		{name: "env off", env: "false", want: false},
		{name: "env off, flag on", env: "0", args: []string{"--user-namespaces=true"}, want: true},
		{name: "env malformed", env: "maybe", wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("SANDBOXD_USER_NAMESPACES", c.env)
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o, err := addRuntimeFlags(fs)
			if c.wantErr {
				if err == nil {
					t.Fatalf("SANDBOXD_USER_NAMESPACES=%q: no error", c.env)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.Parse(append(c.args, "--runtime-binary", "self")); err != nil {
				t.Fatal(err)
			}
			if o.userNamespaces != c.want || o.binary != "self" {
				t.Fatalf("got %+v, want userNamespaces %t and binary self", *o, c.want)
			}
		})
	}
}

// TestParseOptionsRuntime: the server's command line carries the runtime's flags.
func TestParseOptionsRuntime(t *testing.T) {
	o, err := parseOptions([]string{"--user-namespaces=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.runtime == nil || o.runtime.userNamespaces {
		t.Fatalf("--user-namespaces=false parsed to %+v", o.runtime)
	}
}
