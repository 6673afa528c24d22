//go:build linux

package volume

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("volumes need root (loop devices and mounts)")
	}
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		vs, _ := s.List()
		for _, v := range vs {
			s.teardown(v.Name)
		}
	})
	return s
}

func TestVolumeFullIsVolumeFull(t *testing.T) {
	s := newStore(t)
	if _, err := s.Create(context.Background(), "small", MinSizeMB); err != nil {
		t.Fatal(err)
	}
	_, err := s.Write("small", "/big", io.LimitReader(zeros{}, 2*MinSizeMB<<20), WriteOptions{Parents: true})
	if errcode.Of(err) != CodeFull {
		t.Fatalf("a write past the size: %v, want %s", err, CodeFull)
	}
	// The failed write left nothing behind.
	ents, err := s.ListDir("small", "/")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name, ".bothy-upload") {
			t.Fatalf("left %s", e.Name)
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestVolumeFilesDoNotFollowPlantedLinks(t *testing.T) {
	s := newStore(t)
	if _, err := s.Create(context.Background(), "v", MinSizeMB); err != nil {
		t.Fatal(err)
	}
	// What a sandbox could plant: a link to a host file, a link to a host directory.
	mnt := s.MountDir("v")
	if err := os.Symlink("/etc/shadow", filepath.Join(mnt, "shadow")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Open("v", "/shadow"); errcode.Of(err) != errcode.NotARegularFile {
		t.Fatalf("read through a link to /etc/shadow: %v, want not-a-regular-file", err)
	}
	if _, _, err := s.Open("v", "/d/shadow"); errcode.Of(err) != errcode.FileNotFound {
		t.Fatalf("read through a link to /etc: %v, want file-not-found (resolved inside the volume)", err)
	}
	before, _ := os.ReadFile("/etc/hostname")
	if _, err := s.Write("v", "/d/hostname", strings.NewReader("x"), WriteOptions{}); errcode.Of(err) != errcode.FileNotFound {
		t.Fatalf("write through a link to /etc: %v", err)
	}
	if after, _ := os.ReadFile("/etc/hostname"); !bytes.Equal(before, after) {
		t.Fatal("a write through a planted link changed the host's /etc/hostname")
	}
	// A write over the link replaces the link, never writes through it.
	if _, err := s.Write("v", "/shadow", strings.NewReader("mine"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	rc, _, err := s.Open("v", "/shadow")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "mine" {
		t.Fatalf("read %q", b)
	}
	e, err := s.Stat("v", "/shadow")
	if err != nil || e.UID != userUID || e.Type != "file" {
		t.Fatalf("stat: %+v %v", e, err)
	}
}

func TestVolumeInUseIsNotDeleted(t *testing.T) {
	s := newStore(t)
	if _, err := s.Create(context.Background(), "v", MinSizeMB); err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{"sbx-a": true}
	s.SetHeldBy(func(id, _ string) bool { return live[id] })
	if err := s.Hold("sbx-a", []string{"v"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Hold("sbx-gone", []string{"v"}); err != nil {
		t.Fatal(err)
	}
	err := s.Delete("v")
	if errcode.Of(err) != CodeInUse || !strings.Contains(err.Error(), "sbx-a") || strings.Contains(err.Error(), "sbx-gone") {
		t.Fatalf("delete of a held volume: %v", err)
	}
	live["sbx-a"] = false
	if err := s.Delete("v"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("v"); errcode.Of(err) != CodeNotFound {
		t.Fatalf("get after delete: %v", err)
	}
	if ok, _ := s.mounted("v"); ok {
		t.Fatal("still mounted")
	}
}

func TestVolumeCheckRepairsLeftovers(t *testing.T) {
	s := newStore(t)
	if _, err := s.Create(context.Background(), "ready", MinSizeMB); err != nil {
		t.Fatal(err)
	}
	// A half-made volume: its record in state creating, its image mounted.
	if _, err := s.Create(context.Background(), "half", MinSizeMB); err != nil {
		t.Fatal(err)
	}
	v, _ := s.readRecord("half")
	v.State = StateCreating
	if err := s.writeRecord(v); err != nil {
		t.Fatal(err)
	}
	// A record without its image.
	if _, err := s.Create(context.Background(), "lost", MinSizeMB); err != nil {
		t.Fatal(err)
	}
	if err := s.unmount("lost"); err != nil {
		t.Fatal(err)
	}
	os.Remove(s.ImagePath("lost"))
	// A ready volume whose mount went.
	if err := s.unmount("ready"); err != nil {
		t.Fatal(err)
	}
	probs, err := s.Check(false)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, p := range probs {
		kinds[p.Kind+" "+strings.SplitN(p.Entry, "/", 2)[0]] = true
	}
	for _, want := range []string{ProblemHalfMade + " half", ProblemImageMissing + " lost", ProblemUnmounted + " ready"} {
		if !kinds[want] {
			t.Errorf("check did not find %s: %v", want, probs)
		}
	}
	if _, err := s.Check(true); err != nil {
		t.Fatal(err)
	}
	if probs, err := s.Check(false); err != nil || len(probs) != 0 {
		t.Fatalf("after repair: %v %v", probs, err)
	}
	if ok, _ := s.mounted("ready"); !ok {
		t.Fatal("repair did not mount the ready volume")
	}
	if _, err := os.Lstat(filepath.Join(s.dir, "half")); !os.IsNotExist(err) {
		t.Fatalf("the half-made volume is still there: %v", err)
	}
}

// TestOnChangeTellsWhatSucceeded: the hook hears a create and a delete that succeeded, once
// the store's lock is free (the hook may call the store), and nothing of a refused one.
func TestOnChangeTellsWhatSucceeded(t *testing.T) {
	s := newStore(t)
	var heard []string
	s.SetOnChange(func(change, name string) {
		unlock, err := s.lock() // blocks for ever if the store still held it
		if err != nil {
			t.Errorf("taking the store's lock in the hook: %v", err)
		} else {
			unlock()
		}
		heard = append(heard, change+" "+name)
	})
	ctx := context.Background()
	if _, err := s.Create(ctx, "told", MinSizeMB); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "told", MinSizeMB); errcode.Of(err) != CodeExists {
		t.Fatalf("a second create of the name: %v, want %s", err, CodeExists)
	}
	if err := s.Delete("missing"); errcode.Of(err) != CodeNotFound {
		t.Fatalf("a delete of a missing volume: %v, want %s", err, CodeNotFound)
	}
	if err := s.Delete("told"); err != nil {
		t.Fatal(err)
	}
	want := []string{ChangeCreated + " told", ChangeDeleted + " told"}
	if !slices.Equal(heard, want) {
		t.Fatalf("the hook heard %v, want %v", heard, want)
	}
}
