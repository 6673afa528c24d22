package main

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"testing"

	"github.com/bothy/bothy/platform"
)

// TestLoggerUnderJournal: --log-format auto writes for the journal when stderr is the stream
// that JOURNAL_STREAM names (as systemd sets it), and JSON when it names another file, as
// for a child whose stderr was redirected.
func TestLoggerUnderJournal(t *testing.T) {
	if platform.IsTerminal(os.Stderr.Fd()) {
		t.Skip("stderr is a terminal, where auto means coloured text whatever JOURNAL_STREAM says")
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(os.Stderr.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, stream string
		journal      bool
	}{
		{"stderr is the journal", fmt.Sprintf("%d:%d", st.Dev, st.Ino), true},
		{"another stream", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("JOURNAL_STREAM", c.stream)
			log, err := newLogger("auto", "info", os.Stderr)
			if err != nil {
				t.Fatal(err)
			}
			_, text := log.Handler().(*slog.TextHandler)
			_, json := log.Handler().(*slog.JSONHandler)
			if c.journal && !text || !c.journal && !json {
				t.Fatalf("handler %T", log.Handler())
			}
		})
	}
}
