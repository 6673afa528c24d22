package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseTeardownFlags(t *testing.T) {
	o, err := parseTeardownFlags([]string{"--sandboxes", "300", "--clients", "4"}, io.Discard)
	if err != nil || o.sandboxes != 300 || o.clients != 4 || o.diskMB != -1 || !strings.HasPrefix(o.prefix, "teardown-") {
		t.Fatalf("parseTeardownFlags = %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"--sandboxes", "0"}, {"--clients", "0"}, {"--request-timeout", "0s"}, {"--disk-mb", "-2"}, {"extra"}} {
		if _, err := parseTeardownFlags(bad, io.Discard); err == nil {
			t.Errorf("parseTeardownFlags(%q) took it", bad)
		}
	}
}
