package image

import (
	"bytes"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/bothy/bothy/errcode"
)

func importTwoLayers(t *testing.T, s *Store, as string) {
	t.Helper()
	a, b := twoLayers(t)
	want := hostImage(t, []v1.Layer{a, b}...)
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference("example.com/test:v1"), want, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctxT(t), as, &buf, nil); err != nil {
		t.Fatal(err)
	}
}

// TestUsesKeepAnImage checks that a referenced image cannot be deleted or replaced by other
// content, and that it can once its references are gone.
func TestUsesKeepAnImage(t *testing.T) {
	needRoot(t)
	t.Parallel()
	s, _ := openStore(t, Options{})
	importTwoLayers(t, s, "base")
	tx, err := s.Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.AddUse("missing", UseSandbox, "sb1"); errcode.Of(err) != errcode.ImageNotFound {
		t.Errorf("a reference to a missing image: %v; want image-not-found", err)
	}
	if created, err := tx.AddUse("base", UseSandbox, "sb1"); err != nil || !created {
		t.Fatalf("AddUse = %v, %v; want a new reference", created, err)
	}
	if created, err := tx.AddUse("base", UseSandbox, "sb1"); err != nil || created {
		t.Fatalf("AddUse again = %v, %v; want the existing reference", created, err)
	}
	if _, err := tx.AddUse("base", UseGeneration, "py/g-1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Delete("base"); errcode.Of(err) != errcode.ImageInUse {
		t.Fatalf("Delete of an image in use: %v; want image-in-use", err)
	}
	if err := tx.Unlock(); err != nil {
		t.Fatal(err)
	}
	uses, err := s.Uses("base")
	if err != nil || len(uses) != 2 || uses[0].Kind != UseGeneration || uses[1].ID != "sb1" {
		t.Fatalf("Uses = %+v, %v", uses, err)
	}
	// Other content under the same name would change what the users stack.
	var other bytes.Buffer
	img := hostImage(t, gcrLayer(t, tarOf(t, file("other", "x\n"))))
	if err := tarball.Write(name.MustParseReference("example.com/other:v1"), img, &other); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctxT(t), "base", &other, nil); errcode.Of(err) != errcode.ImageInUse {
		t.Fatalf("replacing an image in use: %v; want image-in-use", err)
	}
	tx, err = s.Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range uses {
		if err := tx.RemoveUse("base", u.Kind, u.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.RemoveUse("base", UseSandbox, "sb1"); err != nil {
		t.Errorf("removing a reference twice: %v", err)
	}
	if err := tx.Delete("base"); err != nil {
		t.Fatalf("Delete without references: %v", err)
	}
	_ = tx.Unlock()
	if probs, err := s.Check(ctxT(t), false); err != nil {
		t.Fatal(err)
	} else {
		for _, p := range probs {
			if p.Kind == BadUse || p.Kind == ForeignEntry {
				t.Errorf("after the delete: %v", p)
			}
		}
	}
}
