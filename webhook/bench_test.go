package webhook

import (
	"testing"
)

// BenchmarkEnqueue is what an event costs its publisher when one webhook asked for its type:
// a durable write of the outbox entry (temporary file, fsync, rename, fsync of the directory)
// under the bus's lock. With no webhook asking, Enqueue returns at once.
func BenchmarkEnqueue(b *testing.B) {
	for _, hooks := range []int{0, 1, 4} {
		b.Run(map[int]string{0: "no-webhook", 1: "one-webhook", 4: "four-webhooks"}[hooks], func(b *testing.B) {
			m, err := Open(Options{Root: b.TempDir(), MaxPending: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			for range hooks {
				if _, err := m.Create(CreateRequest{URL: "https://hooks.example.com/x", Events: []string{"sandbox.created"}, Secret: testSecret}); err != nil {
					b.Fatal(err)
				}
			}
			var seq int64
			for b.Loop() {
				seq++
				m.Enqueue(event(seq, "sandbox.created"))
			}
		})
	}
}
