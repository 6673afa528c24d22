package events

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// SeqName is the record of the reserved sequence numbers in the directory Options.SeqDir, and
// seqFormat its format.
const (
	SeqName   = "events.json"
	seqFormat = 1
)

// DefaultSeqBlock is how many sequence numbers one durable write reserves.
const DefaultSeqBlock = 1024

// seqRecord is events.json: every sequence number up to Reserved may have been given to an
// event, so a process that opens the bus starts after it. A block of numbers is reserved
// durably before the first event of the block is published: a crash loses the rest of the
// block (the numbers are skipped, never reused), and only one event in a block waits for a
// write and an fsync.
type seqRecord struct {
	Format   int   `json:"format"`
	Reserved int64 `json:"reserved"`
}

func readSeq(dir string) (int64, error) {
	data, err := platform.ReadFile(filepath.Join(dir, SeqName), record.MaxSize)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var r seqRecord
	if err := record.Decode(SeqName, data, seqFormat, &r); err != nil {
		return 0, err
	}
	if r.Reserved < 0 {
		return 0, fmt.Errorf("events: %s reserves %d sequence numbers", SeqName, r.Reserved)
	}
	return r.Reserved, nil
}

func writeSeq(dir string, reserved int64) error {
	data, err := record.Encode(&seqRecord{Format: seqFormat, Reserved: reserved})
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(dir, SeqName, data, record.Perm)
}

// reserve makes sure that the sequence number next is reserved durably before an event takes
// it. The caller holds b.mu. A failed write is reported to Options.OnError and retried with
// the next event; the event is published all the same (an event stream that stopped for a
// full disk would hide the very events that say so), and only a restart before a successful
// reservation could give its number again.
func (b *Bus) reserve(next int64) {
	if b.seqDir == "" || next <= b.reserved {
		return
	}
	to := next - 1 + b.seqBlock
	if err := writeSeq(b.seqDir, to); err != nil {
		if b.onError != nil {
			b.onError(fmt.Errorf("events: reserving sequence numbers: %w", err))
		}
		return
	}
	b.reserved = to
}
