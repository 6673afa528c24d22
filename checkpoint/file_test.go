package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/bothy/bothy/errcode"
)

// TestFileLayer drives the checkpoints of a sandbox whose writable layer is one file (a
// microVM's disk overlay): a copy leaves the file and its chain in place and copies it into a
// layer; a rotation moves it into a layer (the next launch makes a new one); a rollback throws
// it away and makes the checkpoint's chain the sandbox's; a rotation interrupted after its
// record is finished by Recover from the manifest alone (a Sandbox that knows no File, as the
// start-up's is); a chain past MaxChain is refused, not flattened.
func TestFileLayer(t *testing.T) {
	t.Parallel()
	const name = "disk.qcow2"
	s := &Sandbox{Dir: t.TempDir(), File: name}
	disk := filepath.Join(s.Dir, name)
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(disk, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	layerFile := func(id string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(s.LayerDir(id), name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write("one")
	hold, held := func() (func(), error) { return func() {}, nil }, 0
	c1, err := s.Copy(context.Background(), "c1", Limits{}, func() (func(), error) { held++; return hold() })
	if err != nil || held != 1 || c1.Mode != OpCopy || layerFile(c1.Chain[0]) != "one" || c1.Size == 0 {
		t.Fatalf("copy: %+v, %v (held %d)", c1, err, held)
	}
	if b, _ := os.ReadFile(disk); string(b) != "one" {
		t.Fatalf("the copy took the file: %q", b)
	}
	if m, _ := s.Manifest(); len(m.Chain) != 0 {
		t.Fatalf("a copy changed the sandbox's chain: %v", m.Chain)
	}
	write("two")
	c2, err := s.Rotate("c2", Limits{})
	if err != nil || c2.Mode != OpRotate || layerFile(c2.Chain[0]) != "two" {
		t.Fatalf("rotate: %+v, %v", c2, err)
	}
	if _, err := os.Lstat(disk); !os.IsNotExist(err) {
		t.Fatalf("the rotated file is still the sandbox's: %v", err)
	}
	write("three")
	if _, err := s.Rollback("c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(disk); !os.IsNotExist(err) {
		t.Fatalf("a rollback left the file: %v", err)
	}
	if lowers, _ := s.Lowers(); len(lowers) != 1 || filepath.Base(lowers[0]) != c1.Chain[0] {
		t.Fatalf("the chain after the rollback: %v", lowers)
	}
	if err := s.Sweep(); err != nil {
		t.Fatal(err)
	}

	// A rotation recorded and not made: Recover, knowing no File, finishes it.
	write("four")
	m, err := s.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	c := &Checkpoint{Name: "c3", Chain: append([]string{"aaaa"}, m.Chain...), Mode: OpRotate}
	m.Pending = &Pending{Op: OpRotate, Name: "c3", Layer: "aaaa", Chain: c.Chain, Checkpoint: c, File: name}
	if err := s.write(m); err != nil {
		t.Fatal(err)
	}
	if had, err := (&Sandbox{Dir: s.Dir}).Recover(); !had || err != nil {
		t.Fatalf("recover: %v, %v", had, err)
	}
	if layerFile("aaaa") != "four" {
		t.Fatal("the recovered rotation did not move the file")
	}
	if m, _ := s.Manifest(); m.Find("c3") == nil || !slices.Equal(m.Chain, c.Chain) || m.Pending != nil {
		t.Fatalf("the manifest after the recovery: %+v", m)
	}

	// A rollback recorded and not made: Recover throws the file away.
	write("five")
	m, _ = s.Manifest()
	m.Pending = &Pending{Op: OpRollback, Name: "c2", Chain: m.Find("c2").Chain, Disk: true, File: name}
	if err := s.write(m); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Sandbox{Dir: s.Dir}).Recover(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(disk); !os.IsNotExist(err) {
		t.Fatalf("the recovered rollback left the file: %v", err)
	}

	m, _ = s.Manifest()
	for len(m.Chain) < MaxChain {
		m.Chain = append(m.Chain, "x")
	}
	if err := s.write(m); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rotate("deep", Limits{}); errcode.Of(err) != errcode.CheckpointLimit {
		t.Fatalf("a rotation past MaxChain: %v", err)
	}
	if _, err := s.Copy(context.Background(), "deep", Limits{}, hold); errcode.Of(err) != errcode.CheckpointLimit {
		t.Fatalf("a copy past MaxChain: %v", err)
	}
}

// TestAddToLayerCounts checks that what AddToLayer writes into a copy's layer (a microVM's
// saved memory) is counted in the checkpoint's Size and in Limits.Bytes: a copy whose file
// fits the bound alone is refused when the addition pushes it over, leaves nothing behind,
// and one that fits keeps the addition in its layer.
func TestAddToLayerCounts(t *testing.T) {
	t.Parallel()
	const name, memName = "disk.qcow2", "memory.state"
	s := &Sandbox{Dir: t.TempDir(), File: name}
	if err := os.WriteFile(filepath.Join(s.Dir, name), make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	var memSize int64
	s.AddToLayer = func(dir string) (int64, error) {
		p := filepath.Join(dir, memName)
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
			return 0, err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return 0, err
		}
		memSize = fi.Size()
		return memSize, nil
	}
	noHold := func() (func(), error) { return func() {}, nil }
	// The file alone (64 KiB) fits 512 KiB; with the memory (1 MiB) it does not.
	_, err := s.Copy(context.Background(), "over", Limits{Bytes: 512 << 10}, noHold)
	if errcode.Of(err) != errcode.CheckpointLimit {
		t.Fatalf("a copy whose memory passes the bound: %v; want %s", err, errcode.CheckpointLimit)
	}
	if p, err := s.Problems(); err != nil || len(p) != 0 {
		t.Fatalf("problems after the refused copy: %v %v", p, err)
	}
	if m, _ := s.Manifest(); len(m.Checkpoints) != 0 || m.Pending != nil {
		t.Fatalf("the refused copy left a record: %+v", m)
	}
	c, err := s.Copy(context.Background(), "fits", Limits{Bytes: 4 << 20}, noHold)
	if err != nil {
		t.Fatal(err)
	}
	if c.Size < memSize+1 {
		t.Fatalf("the checkpoint's size %d does not count its memory's %d bytes", c.Size, memSize)
	}
	if fi, err := os.Stat(filepath.Join(s.LayerDir(c.Chain[0]), memName)); err != nil || fi.Size() != memSize {
		t.Fatalf("the layer's memory: %v %v", fi, err)
	}
	if m, _ := s.Manifest(); len(m.Checkpoints) != 1 || m.Checkpoints[0].Size != c.Size {
		t.Fatalf("the listed checkpoint: %+v; want size %d", m.Checkpoints, c.Size)
	}
}
