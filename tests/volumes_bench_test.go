package tests

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
)

// volumeBenchBytes is what each iteration of BenchmarkVolumeThroughput writes or reads.
const volumeBenchBytes = 128 << 20

// BenchmarkVolumeThroughput is a volume's write and read throughput against the same write
// and read to a sandbox's own storage, in one run on one server (docs/performance.md):
//
//   - inside: dd of volumeBenchBytes, fdatasync'd, in a sandbox, to a volume mounted at /data,
//     to its own disk (disk_mb, an ext4 image of its own) and to its writable layer (the
//     overlay's upper directory on the state root); then the file read back (from the page
//     cache: the figure is the mounts' path, not the device's).
//   - api: PUT and GET of volumeBenchBytes through the volumes' files API and through the
//     sandbox files API (the agent inside writes it) to the sandbox's own disk.
//
// MB/s is the throughput; ns/op one write or read.
func BenchmarkVolumeThroughput(b *testing.B) {
	d := benchDaemon(b)
	d.mustStatus(201, "POST", "/v1/volumes", map[string]any{"name": "bench", "size_mb": 1024})
	b.Cleanup(func() { d.doJSON("DELETE", "/v1/volumes/bench", nil) })
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "vol-bench", "start": true,
		"resources": map[string]any{"disk_mb": 1024}, "volumes": []map[string]any{{"name": "bench", "path": "/data"}}})
	b.Cleanup(func() { d.dispose("vol-bench") })
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "layer-bench", "start": true,
		"resources": map[string]any{"disk_mb": 0}})
	b.Cleanup(func() { d.dispose("layer-bench") })

	dd := func(b *testing.B, id, script string) {
		b.Helper()
		got := decode[execJSON](b, d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
			"command": []string{"sh", "-c", script}, "timeout_ms": 600000}), 200)
		if got.ExitCode != 0 {
			b.Fatalf("%s: %+v", script, got)
		}
	}
	write := fmt.Sprintf("dd if=/dev/zero of=%%s bs=1M count=%d conv=fdatasync 2>/dev/null", volumeBenchBytes>>20)
	read := "dd if=%s of=/dev/null bs=1M 2>/dev/null"
	for _, c := range []struct{ name, id, file string }{
		{"volume", "vol-bench", "/data/f"},
		{"own-disk", "vol-bench", "/home/user/f"},
		{"writable-layer", "layer-bench", "/home/user/f"},
	} {
		b.Run("inside/write/"+c.name, func(b *testing.B) {
			b.SetBytes(volumeBenchBytes)
			for range b.N {
				dd(b, c.id, fmt.Sprintf(write, c.file))
			}
		})
		b.Run("inside/read/"+c.name, func(b *testing.B) {
			b.SetBytes(volumeBenchBytes)
			for range b.N {
				dd(b, c.id, fmt.Sprintf(read, c.file))
			}
		})
	}
	payload := make([]byte, volumeBenchBytes)
	octets := http.Header{"Content-Type": {"application/octet-stream"}}
	for _, c := range []struct{ name, path string }{
		{"volume", "/v1/volumes/bench/files?path=/api"},
		{"own-disk", "/v1/sandboxes/vol-bench/files?path=/home/user/api"},
	} {
		b.Run("api/write/"+c.name, func(b *testing.B) {
			b.SetBytes(volumeBenchBytes)
			for range b.N {
				if r := d.do("PUT", c.path, bytes.NewReader(payload), octets); r.Status/100 != 2 {
					b.Fatalf("PUT %s: %d %s", c.path, r.Status, r.Body)
				}
			}
		})
		b.Run("api/read/"+c.name, func(b *testing.B) {
			b.SetBytes(volumeBenchBytes)
			for range b.N {
				r := d.do("GET", c.path, nil, nil)
				if r.Status != 200 || len(r.Body) != volumeBenchBytes {
					b.Fatalf("GET %s: %d, %d bytes", c.path, r.Status, len(r.Body))
				}
			}
		})
	}
}
