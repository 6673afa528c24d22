package tests

import (
	"slices"
	"testing"
	"time"
)

// TestEventsOfCheckpointsForksAndVolumes: a subscriber of /v1/events sees a checkpoint taken
// and deleted, a rollback of a running sandbox (between its stop and its start again), a fork
// (after each fork's own create and start, naming the source and the forks) and a volume
// made and deleted, each with its fields; a refused rollback announces nothing.
func TestEventsOfCheckpointsForksAndVolumes(t *testing.T) {
	d := startVolumeDaemon(t)
	t.Parallel()
	s := d.subscribe("", false)
	d.createNoDisk("evc")
	for _, want := range []string{"sandbox.created", "sandbox.started"} {
		if e := s.next("evc"); e.Type != want {
			t.Fatalf("got %s, want %s", e.Type, want)
		}
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	expect := func(typ, checkpoint, state string) {
		t.Helper()
		e := s.next("evc")
		st := ""
		if e.Event.State != nil {
			st = string(*e.Event.State)
		}
		if e.Type != typ || string(e.Event.Type) != typ || str(e.Event.Checkpoint) != checkpoint || st != state {
			t.Fatalf("got %s (data type %s, checkpoint %q, state %q), want %s %q %q", e.Type, e.Event.Type, str(e.Event.Checkpoint), st, typ, checkpoint, state)
		}
	}

	decode[checkpointJSON](t, d.doJSON("POST", "/v1/sandboxes/evc/checkpoints", map[string]any{"name": "one"}), 201)
	expect("checkpoint.created", "one", "")

	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/evc/checkpoints/one/rollback", nil), 200)
	expect("sandbox.stopped", "", "stopped")
	expect("sandbox.rolled-back", "one", "stopped")
	expect("sandbox.started", "", "running")

	// The forks' own events come first, then the source's sandbox.forked naming them.
	res := decode[forkJSON](t, d.doJSON("POST", "/v1/sandboxes/evc/fork", map[string]any{"ids": []string{"evf1", "evf2"}}), 200)
	for _, it := range res.Items {
		t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+it.ID+"?force=true", nil) })
		if it.Error != nil {
			t.Fatalf("fork %s: %+v", it.ID, it.Error)
		}
	}
	seen := map[string][]string{}
	deadline := time.After(30 * time.Second)
	for {
		var e sseEvent
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatal("the event stream ended")
			}
			e = ev
		case <-deadline:
			t.Fatalf("no sandbox.forked within 30s; the forks had %v", seen)
		}
		if e.Event.Sandbox == nil {
			continue
		}
		sb := *e.Event.Sandbox
		if sb == "evf1" || sb == "evf2" {
			seen[sb] = append(seen[sb], e.Type)
			continue
		}
		if sb != "evc" {
			continue
		}
		if e.Type != "sandbox.forked" || e.Event.Forks == nil || !slices.Equal(*e.Event.Forks, []string{"evf1", "evf2"}) {
			t.Fatalf("the source's next event after the fork: %s, forks %v", e.Type, e.Event.Forks)
		}
		break
	}
	for _, f := range []string{"evf1", "evf2"} {
		if !slices.Equal(seen[f], []string{"sandbox.created", "sandbox.started"}) {
			t.Fatalf("before sandbox.forked, fork %s had the events %v; want its create and start", f, seen[f])
		}
	}

	// A refused rollback announces nothing: the next event about the sandbox is the delete.
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/evc/checkpoints/nope/rollback", nil), 404, "checkpoint-not-found")
	if r := d.doJSON("DELETE", "/v1/sandboxes/evc/checkpoints/one", nil); r.Status != 204 {
		t.Fatalf("deleting the checkpoint: %d %s", r.Status, r.Body)
	}
	expect("checkpoint.deleted", "one", "")

	d.createVolume("evvol", 16)
	if e := s.nextOf("volume.created"); str(e.Event.Volume) != "evvol" || e.Event.Sandbox != nil {
		t.Fatalf("volume.created: volume %q, sandbox %v", str(e.Event.Volume), e.Event.Sandbox)
	}
	if r := d.doJSON("DELETE", "/v1/volumes/evvol", nil); r.Status != 204 {
		t.Fatalf("deleting the volume: %d %s", r.Status, r.Body)
	}
	if e := s.nextOf("volume.deleted"); str(e.Event.Volume) != "evvol" {
		t.Fatalf("volume.deleted: volume %q", str(e.Event.Volume))
	}
}
