package bothy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
)

// TestCheckpointCalls: the checkpoint, rollback and fork calls send what the contract says
// and read its answers; a refusal comes back by its code.
func TestCheckpointCalls(t *testing.T) {
	t.Parallel()
	var seen []string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/sandboxes/sb/checkpoints":
			var body map[string]string
			_ = json.NewDecoder(r.Body).Decode(&body)
			if body["name"] == "taken" {
				problem(w, 409, "checkpoint-exists", "Taken.")
				return
			}
			w.WriteHeader(201)
			_, _ = w.Write([]byte(`{"name":"` + body["name"] + `","created_at":"2026-12-07T00:00:00Z","size_bytes":3,"mode":"copy","layers":1}`))
		case "GET /v1/sandboxes/sb/checkpoints":
			_, _ = w.Write([]byte(`{"items":[{"name":"a","created_at":"2026-12-07T00:00:00Z","size_bytes":3,"mode":"rotate","layers":2}]}`))
		case "POST /v1/sandboxes/sb/checkpoints/a/rollback":
			_, _ = w.Write([]byte(`{"id":"sb","state":"running","image":"host","resources":{},"labels":{},"created_at":"2026-12-07T00:00:00Z"}`))
		case "DELETE /v1/sandboxes/sb/checkpoints/a":
			w.WriteHeader(204)
		case "POST /v1/sandboxes/sb/fork":
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			if body["count"] != float64(2) {
				problem(w, 400, "invalid-request", "Count.")
				return
			}
			_, _ = w.Write([]byte(`{"freeze_ms":4,"items":[{"id":"f1","sandbox":{"id":"f1","state":"running","image":"host","resources":{},"labels":{},"created_at":"2026-12-07T00:00:00Z"}},{"id":"f2","error":{"type":"x","title":"x","status":409,"detail":"Taken.","code":"already-provisioned"}}]}`))
		default:
			problem(w, 404, "not-found", "No route.")
		}
	}))
	ctx := context.Background()
	cp, err := c.CreateCheckpoint(ctx, "sb", "a", 0)
	if err != nil || cp.Name != "a" || cp.SizeBytes != 3 {
		t.Fatalf("create: %+v, %v", cp, err)
	}
	if _, err := c.CreateCheckpoint(ctx, "sb", "taken", 0); !errors.Is(err, ErrCheckpointExists) {
		t.Fatalf("create of a taken name: %v", err)
	}
	list, err := c.Checkpoints(ctx, "sb")
	if err != nil || len(list) != 1 || list[0].Layers != 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if sb, err := c.Rollback(ctx, "sb", "a", 0); err != nil || sb.ID != "sb" {
		t.Fatalf("rollback: %+v, %v", sb, err)
	}
	if err := c.DeleteCheckpoint(ctx, "sb", "a"); err != nil {
		t.Fatal(err)
	}
	res, err := c.Fork(ctx, "sb", 2, nil, 0)
	if err != nil || res.FreezeMs != 4 || len(res.Items) != 2 || res.Items[0].Sandbox == nil || res.Items[1].Error == nil {
		t.Fatalf("fork: %+v, %v", res, err)
	}
	if len(seen) != 6 {
		t.Fatalf("requests: %v", seen)
	}
}
