package tests

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// terminal is a pseudo-terminal whose slave side is a process's controlling terminal, as a
// person's terminal emulator would give it.
type terminal struct {
	t      *testing.T
	master *os.File
	cmd    *exec.Cmd

	// before is the terminal's settings before bothy ran on it.
	before unix.Termios

	mu  sync.Mutex
	out strings.Builder

	// drained is closed when the reader has seen the end of the terminal's output (EIO
	// once every holder of the slave side has closed it), so that output() after exit()
	// holds everything bothy wrote.
	drained chan struct{}
}

// openPTY opens a pseudo-terminal pair of rows by cols.
func openPTY(t *testing.T, rows, cols int) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
		t.Fatal(err)
	}
	return m, s
}

// startOnTerminal runs bothy with args on a new pseudo-terminal, in a session of its own
// with the terminal as its controlling one, so that a resize reaches it as SIGWINCH.
func (d *daemon) startOnTerminal(t *testing.T, rows, cols int, args ...string) *terminal {
	t.Helper()
	master, slave := openPTY(t, rows, cols)
	before, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bothyBin, args...)
	cmd.Env = d.ctlEnv()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	term := &terminal{t: t, master: master, cmd: cmd, before: *before, drained: make(chan struct{})}
	go func() {
		defer close(term.drained)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			term.mu.Lock()
			term.out.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); master.Close() })
	return term
}

func (tm *terminal) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

// waitFor waits until the terminal has shown want, typing again every half second in case a
// typed line was taken before the state it tests (a resize travels separately from input).
func (tm *terminal) waitFor(want, typing string) {
	tm.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	next := time.Now()
	for !strings.Contains(tm.output(), want) {
		if time.Now().After(deadline) {
			tm.t.Fatalf("the terminal never showed %q; it shows:\n%q", want, tm.output())
		}
		if typing != "" && !time.Now().Before(next) {
			tm.typeIn(typing)
			next = time.Now().Add(500 * time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // polling the output buffer, not waiting for a state
	}
}

func (tm *terminal) typeIn(s string) {
	tm.t.Helper()
	if _, err := tm.master.WriteString(s); err != nil {
		tm.t.Fatal(err)
	}
}

func (tm *terminal) resize(rows, cols int) {
	tm.t.Helper()
	if err := unix.IoctlSetWinsize(int(tm.master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
		tm.t.Fatal(err)
	}
}

// exit waits for bothy to end and returns its exit code.
func (tm *terminal) exit() int {
	tm.t.Helper()
	done := make(chan error, 1)
	go func() { done <- tm.cmd.Wait() }()
	select {
	case err := <-done:
		select {
		case <-tm.drained:
		case <-time.After(30 * time.Second):
			tm.t.Fatalf("bothy exited but its terminal never reached its end; it shows:\n%q", tm.output())
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			tm.t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		tm.t.Fatalf("bothy did not exit; the terminal shows:\n%q", tm.output())
		return -1
	}
}

// TestBothyCLITerminal runs exec -it and shell on a real pseudo-terminal: the remote
// terminal has the local one's size, follows its resize, and bothy exits with the
// shell's code and leaves the local terminal as it found it.
func TestBothyCLITerminal(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withToken("ctl-terminal-0123456789abcdef"))
	d.ctlOK("", "create", "tty", "--start")

	for _, args := range [][]string{{"exec", "-it", "tty", "--", "/bin/sh"}, {"shell", "tty"}} {
		t.Run(args[0], func(t *testing.T) {
			tm := d.startOnTerminal(t, 30, 100, args...)
			// The remote tty is the local one's size; it is a terminal (tty answers a device).
			tm.waitFor("size=30x100", "echo size=$(stty size | tr ' ' x)\r")
			tm.waitFor("/dev/pts/", "tty\r")
			tm.resize(40, 120)
			tm.waitFor("size=40x120", "echo size=$(stty size | tr ' ' x)\r")
			tm.typeIn("exit 3\r")
			if code := tm.exit(); code != 3 {
				t.Fatalf("exit code %d, want 3; the terminal shows:\n%q", code, tm.output())
			}
			// Raw mode was undone: the terminal's line discipline is back as it was.
			after, err := unix.IoctlGetTermios(int(tm.master.Fd()), unix.TCGETS)
			if err != nil {
				t.Fatal(err)
			}
			if after.Lflag != tm.before.Lflag || tm.before.Lflag&unix.ICANON == 0 {
				t.Fatalf("the terminal was left in raw mode: lflag %#x, was %#x", after.Lflag, tm.before.Lflag)
			}
		})
	}
}
