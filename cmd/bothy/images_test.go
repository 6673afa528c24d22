package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/bothy/bothy/sdk/go/bothy"
)

func layer(done, total int64) bothy.ImageLayer {
	return bothy.ImageLayer{DiffID: "sha256:x", BytesDone: &done, BytesTotal: &total}
}

func pulling(layers ...bothy.ImageLayer) *bothy.Image {
	return &bothy.Image{Name: "bb", State: bothy.ImagePulling, Layers: &layers}
}

// TestPullProgressLines: off a terminal a pull prints its layer count once and a line per
// layer completed, not one per reading, and ends with the whole size.
func TestPullProgressLines(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	c := &cli{stderr: &errOut}
	show := c.pullProgress("bb")
	ready := []bothy.ImageLayer{{DiffID: "a"}, {DiffID: "b"}}
	for _, img := range []*bothy.Image{
		{Name: "bb", State: bothy.ImagePulling}, // the manifest is not read yet
		pulling(layer(0, 1024), layer(0, 2048)),
		pulling(layer(512, 1024), layer(0, 2048)),
		pulling(layer(1024, 1024), layer(0, 2048)),
		pulling(layer(1024, 1024), layer(1024, 2048)),
		{Name: "bb", State: bothy.ImageReady, Layers: &ready},
	} {
		show(img)
	}
	c.endProgress()
	want := "bb: 2 layers\nbb: 1/2 layers done, 1.0KiB of 3.0KiB\nbb: 2/2 layers done, 3.0KiB of 3.0KiB\n"
	if errOut.String() != want {
		t.Errorf("progress lines:\n%s\nwant:\n%s", errOut.String(), want)
	}
}

// TestProgressBar: the bar fills with the bytes, and an unknown total shows as such.
func TestProgressBar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		done, total int64
		want        string
	}{
		{0, 0, "bb [>" + strings.Repeat(" ", barWidth-1) + "] 0B/?  0/2 layers"},
		{512, 1024, "bb [" + strings.Repeat("=", barWidth/2) + ">" + strings.Repeat(" ", barWidth/2-1) + "] 512B/1.0KiB  0/2 layers"},
		{1024, 1024, "bb [" + strings.Repeat("=", barWidth) + "] 1.0KiB/1.0KiB  0/2 layers"},
		{4096, 1024, "bb [" + strings.Repeat("=", barWidth) + "] 4.0KiB/1.0KiB  0/2 layers"},
	} {
		if got := progressBar("bb", tc.done, tc.total, 0, 2); got != tc.want {
			t.Errorf("progressBar(%d, %d) = %q; want %q", tc.done, tc.total, got, tc.want)
		}
	}
}
