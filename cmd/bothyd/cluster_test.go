package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseOptionsCluster(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(*clusterOptions) bool
	}{
		{name: "off by default", args: nil, check: func(c *clusterOptions) bool { return !c.enabled }},
		{
			name: "node mode", args: []string{"--cluster-node", "--cluster-node-name", "n1", "--cluster-lease-duration", "6s"},
			check: func(c *clusterOptions) bool {
				return c.enabled && c.nodeName == "n1" && c.leaseDuration == 6*time.Second && c.namespace == "bothy-system" && c.maxSandboxes == defaultMaxSandboxes
			},
		},
		{name: "no slots", args: []string{"--cluster-node", "--cluster-max-sandboxes", "0"}, wantErr: "--cluster-max-sandboxes 0"},
		{name: "a lease too short", args: []string{"--cluster-node", "--cluster-lease-duration", "1s"}, wantErr: "--cluster-lease-duration 1s"},
		{name: "CPU undercommitted", args: []string{"--cluster-node", "--cluster-cpu-overcommit", "0.5"}, wantErr: "--cluster-cpu-overcommit 0.5"},
		{name: "no name", args: []string{"--cluster-node", "--cluster-node-name", ""}, wantErr: "needs a node name"},
		// Out of node mode the cluster flags are not checked: they configure nothing.
		{name: "unchecked when off", args: []string{"--cluster-max-sandboxes", "0"}, check: func(c *clusterOptions) bool { return !c.enabled }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseOptions(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(o.cluster) {
				t.Fatalf("options %+v", *o.cluster)
			}
		})
	}
}
