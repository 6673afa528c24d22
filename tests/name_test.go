package tests

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// formerName matches the project's name before the rename to bothy, and its CLI's and load
// tool's, in any case, as a word of its own or the start of an identifier such as an
// environment variable's or a metric's (a following letter makes another word, such as
// SandboxDir). It is spelled in pieces so that this file does not say it.
var formerName = regexp.MustCompile(`(?i)sandbox(` + "d" + `|ctl|load)([^a-z]|$)`)

// TestFormerNameIsGone: no tracked file says the former name, in its path or its text, but the
// one line of the README that tells readers what the project was called before. Generated files
// count: they are what users see too.
func TestFormerNameIsGone(t *testing.T) {
	t.Parallel()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): the tracked files cannot be listed", err)
	}
	root := strings.TrimSpace(string(top))
	list, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var found []string
	readmeLines := 0
	for _, path := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		if formerName.MatchString(path) {
			found = append(found, path+": in its path")
		}
		data, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree and not yet committed
			}
			t.Fatalf("reading %s: %v", path, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if !formerName.MatchString(line) {
				continue
			}
			if path == "README.md" && strings.Contains(line, "was called") {
				readmeLines++
				continue
			}
			found = append(found, fmt.Sprintf("%s:%d: %.160s", path, n, line))
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
	}
	if readmeLines != 1 {
		t.Errorf("the README has %d lines saying what the project was called before, want exactly 1", readmeLines)
	}
	if len(found) > 0 {
		t.Fatalf("%d places still say the former name (rename them to bothy, bothyd or BOTHY_):\n%s", len(found), strings.Join(found, "\n"))
	}
}
