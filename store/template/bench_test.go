package template

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkLeaseAcquireRelease measures one whole clone binding and its removal: lock,
// Leasable, WriteLease, WriteBinding, unlock; then RemoveBinding and Release. Each step is
// durable (fsyncs), so this is dominated by the disk's flush latency.
func BenchmarkLeaseAcquireRelease(b *testing.B) {
	e := newEnv(b)
	gen := e.template(b, "py")
	benchLeases(b, e, gen)
}

func benchLeases(b *testing.B, e *env, gen string) {
	dir := e.sandboxDir(b, "bench")
	ctx := ctxT(b)
	b.ResetTimer()
	for b.Loop() {
		tx, err := e.s.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Leasable("py", gen, e.clock.get()); err != nil {
			b.Fatal(err)
		}
		l, err := tx.WriteLease("py", gen, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := WriteBinding(dir, NewBinding(l)); err != nil {
			b.Fatal(err)
		}
		tx.Unlock()
		if err := RemoveBinding(dir); err != nil {
			b.Fatal(err)
		}
		if err := e.s.Release(ctx, "py", gen, l.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLeaseBySize shows that a lease costs the same whatever the generation's size:
// acquiring reads three small records and writes one, never touching the payload.
func BenchmarkLeaseBySize(b *testing.B) {
	for _, size := range []int64{1 << 20, 256 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			e := newEnv(b)
			if _, err := e.s.CreateTemplate(ctxT(b), "py"); err != nil {
				b.Fatal(err)
			}
			src := b.TempDir()
			writeTree(b, src, size)
			g, err := e.s.Capture(ctxT(b), "py", src, testKey, nil)
			if err != nil {
				b.Fatal(err)
			}
			benchLeases(b, e, g.ID)
		})
	}
}

// BenchmarkCaptureVsCp captures a 64 MiB tree of mixed files and copies the same tree with
// `cp -a`, and reports both times and their ratio. cp -a does not fsync; "cp-a+sync-ms" adds
// a `sync -f` of the file system afterwards, which is closer to what a capture guarantees.
func BenchmarkCaptureVsCp(b *testing.B) {
	if _, err := exec.LookPath("cp"); err != nil {
		b.Skip("no cp")
	}
	e := newEnv(b)
	if _, err := e.s.CreateTemplate(ctxT(b), "py"); err != nil {
		b.Fatal(err)
	}
	src := b.TempDir()
	total := writeTree(b, src, 64<<20)
	b.SetBytes(total)
	var capture, cp, cpSync time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		g, err := e.s.Capture(ctxT(b), "py", src, testKey, nil)
		if err != nil {
			b.Fatal(err)
		}
		capture += time.Since(start)

		dst := filepath.Join(b.TempDir(), "copy")
		start = time.Now()
		if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp -a: %v: %s", err, out)
		}
		cp += time.Since(start)
		if err := exec.Command("sync", "-f", dst).Run(); err != nil {
			b.Fatal(err)
		}
		cpSync += time.Since(start)

		b.StopTimer()
		if _, err := e.s.Retire(ctxT(b), "py", g.ID, false, nil); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(dst)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(capture.Milliseconds())/n, "capture-ms")
	b.ReportMetric(float64(cp.Milliseconds())/n, "cp-a-ms")
	b.ReportMetric(float64(cpSync.Milliseconds())/n, "cp-a+sync-ms")
	b.ReportMetric(float64(capture)/float64(cp), "capture/cp-a")
	b.ReportMetric(float64(capture)/float64(cpSync), "capture/cp-a+sync")
}

// writeTree writes about size bytes of mixed files under dir: half in 4 MiB files, a quarter
// in 128 KiB files, a quarter in 16 KiB files, spread over nested directories. It returns the
// bytes written.
func writeTree(b testing.TB, dir string, size int64) int64 {
	b.Helper()
	var written int64
	block := make([]byte, 4<<20)
	for i := range block {
		block[i] = byte(i*7 + i>>9)
	}
	n := 0
	put := func(budget, fileSize int64) {
		for used := int64(0); used+fileSize <= budget; used += fileSize {
			sub := filepath.Join(dir, fmt.Sprintf("d%d", n%16), fmt.Sprintf("e%d", n%5))
			if err := os.MkdirAll(sub, 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", n)), block[:fileSize], 0o644); err != nil {
				b.Fatal(err)
			}
			written += fileSize
			n++
		}
	}
	big := int64(4 << 20)
	if size < 4*big {
		big = size / 4
	}
	put(size/2, big)
	put(size/4, 128<<10)
	put(size/4, 16<<10)
	return written
}
