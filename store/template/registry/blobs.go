package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// FileMediaType is the media type of a large file of a payload stored as a blob of its own.
const FileMediaType = "application/vnd.bothy.template.file.v1"

// BlobThreshold is the size from which a regular file of a payload is a blob of its own
// rather than part of the archive: a generation that keeps a large file of an earlier one
// (a clone's capture keeps its generation's files) names the same blob, which a push skips
// when the registry holds it, so only what is new is uploaded.
const BlobThreshold = 1 << 20

// The PAX records of an archive entry whose content is a blob of its own: its digest and
// size. The entry itself has no content.
const (
	paxBlob     = "BOTHY.blob"
	paxBlobSize = "BOTHY.size"
)

// fileBlob is a large file of a payload pushed as a blob of its own.
type fileBlob struct {
	path   string // relative to the payload
	digest v1.Hash
	size   int64
}

// blobIndex is what a push's first pass learns of a payload's large files, for the second
// pass (the archive names their digests) and the manifest (their layers, in first-seen
// order, each digest once).
type blobIndex struct {
	byPath map[string]fileBlob
	order  []fileBlob
	seen   map[v1.Hash]bool
}

func newBlobIndex() *blobIndex {
	return &blobIndex{byPath: map[string]fileBlob{}, seen: map[v1.Hash]bool{}}
}

// digestFile hashes f (size bytes) unless the first pass did.
func (bi *blobIndex) digestFile(path string, f io.Reader, size int64) (v1.Hash, error) {
	if b, ok := bi.byPath[path]; ok && b.size == size {
		return b.digest, nil
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, size); err != nil {
		return v1.Hash{}, err
	}
	d := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	b := fileBlob{path: path, digest: d, size: size}
	bi.byPath[path] = b
	if !bi.seen[d] {
		bi.seen[d] = true
		bi.order = append(bi.order, b)
	}
	return d, nil
}

// fileLayer is a large file of a payload, pushed as a layer of its own.
type fileLayer struct {
	root *os.Root // the payload
	b    fileBlob
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.b.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.b.digest, nil }
func (l *fileLayer) Size() (int64, error)                 { return l.b.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return FileMediaType, nil }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return l.Compressed() }

// Compressed opens the file inside the payload (os.Root: nothing outside it is reachable);
// a generation's payload never changes, and the registry refuses content of another digest.
func (l *fileLayer) Compressed() (io.ReadCloser, error) {
	f, err := l.root.Open(l.b.path)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, l.b.size), f}, nil
}
