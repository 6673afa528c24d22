package webhook

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// Names in the state root.
const (
	// Dir is the directory of the webhooks' records in the state root.
	Dir = "webhooks"
	// LockName is the lock the delivering server holds in Dir.
	LockName = "lock"
	// StateName is the delivery state in a webhook's outbox.
	StateName = "state.json"

	hookFormat  = 1
	entryFormat = 1
	stateFormat = 1
	recordExt   = ".json"
)

// hookRecord is <id>.json.
type hookRecord struct {
	Format    int       `json:"format"`
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	Secret    string    `json:"secret"`
	CreatedAt time.Time `json:"created_at"`
}

// entry is one outbox entry, <id>/<event id>.json: the event as delivered, and its attempts.
type entry struct {
	Format     int             `json:"format"`
	EventID    int64           `json:"event_id"`
	Type       string          `json:"type"`
	Body       json.RawMessage `json:"body"`
	EnqueuedAt time.Time       `json:"enqueued_at"`
	Attempts   int             `json:"attempts"`
	NextAt     time.Time       `json:"next_attempt_at"`
}

// deliveryState is <id>/state.json: what the API shows of past deliveries. It is rewritten
// after each attempt; losing its last version to a crash loses only counters.
type deliveryState struct {
	Format        int        `json:"format"`
	Delivered     int64      `json:"delivered"`
	Failed        int64      `json:"failed"`
	Dropped       int64      `json:"dropped"`
	LastAttemptAt *time.Time `json:"last_attempt_at,omitempty"`
	LastStatus    int        `json:"last_status,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	LastSuccessAt *time.Time `json:"last_success_at,omitempty"`
}

// entryName is the outbox file of an event: its id zero-padded, so that names sort as ids do.
func entryName(eventID int64) string { return fmt.Sprintf("%020d%s", eventID, recordExt) }

// parseEntryName returns the event id of an outbox file name.
func parseEntryName(name string) (int64, bool) {
	digits, ok := strings.CutSuffix(name, recordExt)
	if !ok || len(digits) != 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	return n, err == nil && n >= 0
}

// hookIDOf returns the webhook id of a record name, <id>.json.
func hookIDOf(name string) (string, bool) {
	id, ok := strings.CutSuffix(name, recordExt)
	return id, ok && ValidID(id)
}

// ValidID reports whether id has the form of a webhook id: "wh-" and 16 hex digits.
func ValidID(id string) bool {
	hex, ok := strings.CutPrefix(id, "wh-")
	if !ok || len(hex) != 16 {
		return false
	}
	for i := 0; i < len(hex); i++ {
		c := hex[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func readRecord[T any](dir, name string, format int) (*T, error) {
	data, err := platform.ReadFile(dir+"/"+name, record.MaxSize)
	if err != nil {
		return nil, err
	}
	v := new(T)
	if err := record.Decode(name, data, format, v); err != nil {
		return nil, err
	}
	return v, nil
}

func writeRecord(dir, name string, v any) error {
	data, err := record.Encode(v)
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(dir, name, data, record.Perm)
}
