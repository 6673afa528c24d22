package systemd

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"strconv"

	"github.com/coreos/go-systemd/v22/journal"
)

// StderrIsJournal reports whether this process's stderr is systemd's journal stream: the
// JOURNAL_STREAM variable names the device and inode of the stream systemd connected, and
// stderr is still that stream (a child whose stderr was redirected inherits the variable but
// not the stream, and is rightly told no).
func StderrIsJournal() bool {
	ok, err := journal.StderrIsJournalStream()
	return err == nil && ok
}

// NewJournalHandler returns a slog handler for the journal's stream transport: one line per
// record, the syslog priority of its level as the `<N>` prefix journald reads (sd-daemon(3)),
// no timestamp (the journal stamps every line itself) and no colours. The text is slog's
// key=value form, so `journalctl -u bothyd` reads as the terminal's log does, and
// `journalctl -p warning` filters by level.
func NewJournalHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	o := slog.HandlerOptions{}
	if opts != nil {
		o = *opts
	}
	next := o.ReplaceAttr
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		if next != nil {
			return next(groups, a)
		}
		return a
	}
	return slog.NewTextHandler(&priorityWriter{w: w}, &o)
}

// priorityWriter puts the syslog priority of a record's level before its line. slog's text
// handler writes each record with one Write call, starting with its level once the time is
// dropped ("level=WARN msg=..."), and serialises those calls, so the priority can be read from
// the start of each write.
type priorityWriter struct {
	w io.Writer
}

func (p *priorityWriter) Write(b []byte) (int, error) {
	line := make([]byte, 0, len(b)+3)
	line = append(line, '<')
	line = strconv.AppendInt(line, int64(priorityOf(b)), 10)
	line = append(line, '>')
	line = append(line, b...)
	if _, err := p.w.Write(line); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Syslog priorities (sd-daemon(3), syslog(3)).
const (
	prioErr     = 3
	prioWarning = 4
	prioInfo    = 6
	prioDebug   = 7
)

// priorityOf maps the level a text record starts with to a syslog priority. Levels between
// slog's four (INFO+2) take the priority of the one below them; a line that starts otherwise
// is informational.
func priorityOf(record []byte) int {
	rest, ok := bytes.CutPrefix(record, []byte("level="))
	if !ok {
		return prioInfo
	}
	switch {
	case bytes.HasPrefix(rest, []byte("ERROR")):
		return prioErr
	case bytes.HasPrefix(rest, []byte("WARN")):
		return prioWarning
	case bytes.HasPrefix(rest, []byte("DEBUG")):
		return prioDebug
	}
	return prioInfo
}

// Journal reports whether the log should be written for the journal: w is this process's
// stderr and that is the journal's stream.
func Journal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && f == os.Stderr && StderrIsJournal()
}
