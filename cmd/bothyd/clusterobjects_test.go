package main

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// TestCreateBody: a Sandbox object's spec becomes the REST API's create request of the same
// meaning, started, with the object's name as the id; what the spec leaves out is left to the
// server's defaults.
func TestCreateBody(t *testing.T) {
	tests := []struct {
		name string
		spec v1alpha1.SandboxSpec
		want string
	}{
		{name: "empty", want: `{"id":"s1","start":true}`},
		{
			name: "everything",
			spec: v1alpha1.SandboxSpec{
				Image: "host", Runtime: "namespace", Internet: true, Labels: map[string]string{"team": "a"},
				Template:  &v1alpha1.TemplateRef{Template: "py", Generation: "g2"},
				Resources: v1alpha1.Resources{VCPUs: 2, MemoryMB: 256, Pids: 64, DiskMB: 100},
				NodeName:  "node-a", // placement's, not the create's
			},
			want: `{"generation":"g2","id":"s1","image":"host","labels":{"team":"a"},"network":{"internet":true},` +
				`"resources":{"disk_mb":100,"memory_mb":256,"pids":64,"vcpus":2},"runtime":"namespace","start":true,"template":"py"}`,
		},
		{name: "a template of no generation", spec: v1alpha1.SandboxSpec{Template: &v1alpha1.TemplateRef{Template: "py"}}, want: `{"id":"s1","start":true,"template":"py"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, err := createBody(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "s1"}, Spec: tt.spec})
			if err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			// Compared as decoded JSON: the request type's field order is not the point.
			var got, want any
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			if string(g) != string(w) {
				t.Fatalf("create body\n got %s\nwant %s", g, w)
			}
		})
	}
}
