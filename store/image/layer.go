package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"

	"github.com/klauspost/compress/zstd"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// Source is an image to add to the store, whatever it came from: a registry (see
// store/image/registry) or an archive (see [Store.Import]). Its layers are read lazily, one
// at a time, and only those the store does not hold already.
type Source struct {
	// Ref is the reference the image was resolved from, empty for an archive.
	Ref string
	// ManifestDigest is the digest of the image's manifest.
	ManifestDigest string
	// Config is the image configuration, as its digest covers it.
	Config []byte
	// ConfigDigest, when set, is checked against Config.
	ConfigDigest string
	// Layers are the manifest's layers, bottom to top, as many as the configuration's
	// rootfs.diff_ids.
	Layers []SourceLayer
}

// SourceLayer is one layer of a [Source].
type SourceLayer struct {
	// Digest, when set, is checked against the bytes Open gives (the compressed blob); a
	// docker save layer has none. The diff id from the configuration is always checked.
	Digest string
	// Size is the number of bytes Open gives, or -1 when unknown; progress reports it.
	Size int64
	// Open opens the layer's blob: a tar stream, plain, gzip- or zstd-compressed (the
	// compression is told from the stream's first bytes, not from a media type).
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// LayerProgress reports how far the reading of one layer has come.
type LayerProgress struct {
	Index  int    // the layer's position, 0 at the bottom
	DiffID string // the layer's diff id
	Done   int64  // bytes read so far
	Total  int64  // bytes in all, -1 when unknown
	// Present is set when the store already holds the layer and reads nothing of it.
	Present bool
}

// Progress receives [LayerProgress] reports. It is called from the goroutine doing the
// work and must return quickly.
type Progress func(LayerProgress)

// ensureLayer makes the layer diffID present in the store, unpacking it from sl when it is
// not. It reports whether the layer was present already. A layer is unpacked into a
// temporary directory, ".<hex>.<random>.tmp", which its unpacker holds an flock on; the
// directory is renamed to <hex> only once the tar stream is unpacked, both digests are
// checked, the file system is flushed and the layer's record is written. A crash at any point
// before the rename therefore leaves only a temporary name, which Check reports.
func (s *Store) ensureLayer(ctx context.Context, index int, diffID string, sl SourceLayer, progress Progress) (*layerRecord, bool, error) {
	hexID, err := digestHex(diffID)
	if err != nil {
		return nil, false, err
	}
	if rec, ok := s.presentLayer(hexID); ok {
		return rec, true, nil
	}
	tmp := platform.TempName(hexID)
	if err := platform.MkdirAt(s.layers, tmp, 0o700); err != nil {
		return nil, false, err
	}
	tdir, err := platform.OpenDirAt(s.layers, tmp)
	if err != nil {
		return nil, false, err
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = os.RemoveAll(tdir.Name())
		}
		tdir.Close()
	}()
	// The lock tells Check that this temporary directory is being written, not left by a
	// crash; it ends with the process.
	if got, err := platform.TryLock(tdir); err != nil || !got {
		return nil, false, errors.Join(err, fmt.Errorf("image: a fresh layer directory is locked by someone else"))
	}
	rec, err := s.unpackInto(ctx, tdir, index, diffID, sl, progress)
	if err != nil {
		return nil, false, err
	}
	if err := platform.SyncDir(tdir); err != nil {
		return nil, false, err
	}
	err = renameNoReplace(s.layers, tmp, hexID)
	if errors.Is(err, fs.ErrExist) {
		// Another unpacker, perhaps in another process, finished the same layer first: its
		// content is the same, as the diff id says.
		if rec, ok := s.presentLayer(hexID); ok {
			return rec, true, nil
		}
		return nil, false, errcode.New(errcode.Internal, "The layer %s is in the store but its record does not read; run bothyd check --repair.", diffID)
	}
	if err != nil {
		return nil, false, err
	}
	renamed = true
	if err := platform.SyncDir(s.layers); err != nil {
		return nil, false, fmt.Errorf("image: the layer %s may not survive a crash: %w", diffID, err)
	}
	return rec, false, nil
}

// presentLayer reports whether the layer hexID is whole in the store (its directory and
// record read).
func (s *Store) presentLayer(hexID string) (*layerRecord, bool) {
	d, err := platform.OpenDirAt(s.layers, hexID)
	if err != nil {
		return nil, false
	}
	defer d.Close()
	rec, err := readLayerRecord(d)
	if err != nil || rec.DiffID != Algorithm+":"+hexID {
		return nil, false
	}
	return rec, true
}

// unpackInto reads sl's blob, checks its digests and unpacks it into tdir/fs, then writes
// tdir/layer.json.
func (s *Store) unpackInto(ctx context.Context, tdir *os.File, index int, diffID string, sl SourceLayer, progress Progress) (*layerRecord, error) {
	if err := platform.MkdirAt(tdir, LayerFS, 0o755); err != nil {
		return nil, err
	}
	fsDir, err := platform.OpenDirAt(tdir, LayerFS)
	if err != nil {
		return nil, err
	}
	defer fsDir.Close()
	rc, err := sl.Open(ctx)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	report := func(done int64) {
		if progress != nil {
			progress(LayerProgress{Index: index, DiffID: diffID, Done: done, Total: sl.Size})
		}
	}
	report(0)
	raw := &meter{ctx: ctx, r: rc, h: sha256.New(), max: s.opts.MaxLayerBytes, what: "compressed layer", report: report}
	plain, closeDec, err := decompress(raw)
	if err != nil {
		return nil, err
	}
	defer closeDec()
	tarStream := &meter{ctx: ctx, r: plain, h: sha256.New(), max: s.opts.MaxLayerBytes, what: "layer"}
	stats, err := unpackTar(tarStream, fsDir, s.opts.Limits)
	if err != nil {
		return nil, err
	}
	// The digests cover the whole streams, the tar archive's padding and anything after
	// its end included.
	if _, err := io.Copy(io.Discard, tarStream); err != nil {
		return nil, badArchive("layer %d does not decompress: %v", index, err)
	}
	if _, err := io.Copy(io.Discard, raw); err != nil {
		return nil, err
	}
	if got := digestOf(tarStream.h.Sum(nil)); got != diffID {
		return nil, digestMismatch(fmt.Sprintf("uncompressed layer %d", index), diffID, got)
	}
	if got := digestOf(raw.h.Sum(nil)); sl.Digest != "" && got != sl.Digest {
		return nil, digestMismatch(fmt.Sprintf("layer %d", index), sl.Digest, got)
	}
	rec := &layerRecord{Format: layerFormat, DiffID: diffID, Size: tarStream.n, Stats: stats}
	data, err := record.Encode(rec)
	if err != nil {
		return nil, err
	}
	if err := platform.WriteFileDurableAt(tdir, LayerRec, data, 0o600); err != nil {
		return nil, err
	}
	return rec, nil
}

// decompress tells the compression of r from its first bytes: gzip, zstd, or none.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, badArchive("a layer is not valid gzip: %v", err)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// The window bound keeps a hostile frame from making the decoder allocate more
		// than 128 MiB.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			return nil, nil, badArchive("a layer is not valid zstd: %v", err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// meter reads r, hashing what it reads, checking ctx, refusing more than max bytes and
// reporting the count.
type meter struct {
	ctx    context.Context
	r      io.Reader
	h      hash.Hash
	n, max int64
	what   string
	report func(int64)
}

func (m *meter) Read(p []byte) (int, error) {
	if err := m.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := m.r.Read(p)
	m.h.Write(p[:n])
	m.n += int64(n)
	if m.n > m.max {
		return n, tooLarge("the %s is larger than %d bytes", m.what, m.max)
	}
	if m.report != nil && n > 0 {
		m.report(m.n)
	}
	return n, err
}
