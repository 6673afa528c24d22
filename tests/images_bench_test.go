package tests

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// BenchmarkImageImport imports a 100 MiB image (a docker save archive of incompressible
// bytes), under a new name each iteration, after deleting the previous one and repairing the
// store's layers away, so that every import unpacks its layers anew. A figure, not asserted.
func BenchmarkImageImport(b *testing.B) {
	d := benchDaemon(b)
	archive := dockerSave(b, busyboxImage(b, v1.Config{Env: []string{"PATH=/bin"}}, 100<<20))
	b.SetBytes(int64(len(archive)))
	var lat latencies
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("big-%d", i)
		start := time.Now()
		r := d.do("PUT", "/v1/images/"+name, bytes.NewReader(archive), http.Header{"Content-Type": {"application/octet-stream"}})
		lat = append(lat, time.Since(start))
		if r.Status != 201 {
			b.Fatalf("import: %d %s", r.Status, r.Body)
		}
		b.StopTimer()
		d.mustStatus(204, "DELETE", "/v1/images/"+name, nil)
		if _, code, stderr := runCheck(b, d.Root, "--repair"); code != 0 {
			b.Fatalf("check --repair: %d %s", code, stderr)
		}
		b.StartTimer()
	}
	lat.report(b, "import-")
}

// BenchmarkStartOnImage creates and starts a sandbox on an OCI image and on host, alternately
// in the same run, and reports both (the aim of issue 15: within 10%). A figure, not asserted.
func BenchmarkStartOnImage(b *testing.B) {
	d := benchDaemon(b)
	d.importImage("bench-bb", dockerSave(b, busyboxImage(b, v1.Config{Env: []string{"PATH=/bin"}}, 0)))
	var onImage, onHost latencies
	b.ResetTimer()
	for i := range b.N {
		for _, image := range []string{"bench-bb", "host"} {
			id := fmt.Sprintf("bench-%s-%d", image, i)
			start := time.Now()
			d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "image": image, "start": true})
			took := time.Since(start)
			if image == "host" {
				onHost = append(onHost, took)
			} else {
				onImage = append(onImage, took)
			}
			b.StopTimer()
			d.dispose(id)
			b.StartTimer()
		}
	}
	onImage.report(b, "image-")
	onHost.report(b, "host-")
}
