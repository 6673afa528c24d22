package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// The registry process: go-containerregistry's registry (pkg/registry) in a process of its
// own, which a test kills with SIGKILL and starts again on the same address and storage
// directory, as an operator's registry dies and comes back. The test binary is re-executed
// as that process (registryProcessEnv set), before TestMain.
//
// Its storage: blobs on disk (pkg/registry's disk blob handler, which writes a blob under a
// temp name and renames it once whole), and a log of the manifests put and deleted,
// appended and fsynced before the answer and replayed at start, so that a restarted
// registry serves what it acknowledged, as a real one (distribution) does. An upload
// session in flight is lost with the process, as it is with distribution's.
//
// The stall: while <dir>/stall holds "push", an upload request with more than
// registryStallBytes of body reads that much and hangs (its client waits); while it holds
// "pull", a GET of a blob larger than that sends half of it and hangs. Either first creates
// <dir>/stalled-push or <dir>/stalled-pull, which the test waits for before it kills.
const (
	registryProcessEnv = "BOTHY_TEST_REGISTRY_PROCESS"
	registryStallBytes = 1 << 20
)

func init() {
	dir := os.Getenv(registryProcessEnv)
	if dir == "" {
		return
	}
	if err := serveRegistryProcess(dir, os.Getenv("BOTHY_TEST_REGISTRY_ADDR")); err != nil {
		fmt.Fprintln(os.Stderr, "registry process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// manifestLogEntry is one line of the manifests' log.
type manifestLogEntry struct {
	Method      string `json:"method"`
	Path        string `json:"path"`
	ContentType string `json:"content_type,omitempty"`
	Body        []byte `json:"body,omitempty"`
}

func serveRegistryProcess(dir, addr string) error {
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o700); err != nil {
		return err
	}
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)),
		ggcrregistry.WithBlobHandler(ggcrregistry.NewDiskBlobHandler(filepath.Join(dir, "blobs"))))
	logPath := filepath.Join(dir, "manifests.log")
	if err := replayManifests(inner, logPath); err != nil {
		return err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	var logMu sync.Mutex
	stall := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "stall"))
		return strings.TrimSpace(string(b))
	}
	signal := func(what string) { _ = os.WriteFile(filepath.Join(dir, "stalled-"+what), nil, 0o600) }

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isUpload := strings.Contains(r.URL.Path, "/blobs/uploads/") && (r.Method == http.MethodPatch || r.Method == http.MethodPut || r.Method == http.MethodPost)
		if isUpload && stall() == "push" && r.Body != nil {
			head, _ := io.ReadAll(io.LimitReader(r.Body, registryStallBytes+1))
			if len(head) > registryStallBytes {
				signal("push")
				<-r.Context().Done()
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(head))
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") && stall() == "pull" {
			rec := httptest.NewRecorder()
			inner.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			if rec.Code == http.StatusOK && len(body) > registryStallBytes {
				w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write(body[:len(body)/2])
				w.(http.Flusher).Flush()
				signal("pull")
				<-r.Context().Done()
				return
			}
			copyResponse(w, rec)
			return
		}
		if strings.Contains(r.URL.Path, "/manifests/") && (r.Method == http.MethodPut || r.Method == http.MethodDelete) {
			body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			rec := httptest.NewRecorder()
			logMu.Lock()
			defer logMu.Unlock()
			inner.ServeHTTP(rec, r)
			if rec.Code/100 == 2 {
				line, _ := json.Marshal(manifestLogEntry{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Body: body})
				if _, err := logFile.Write(append(line, '\n')); err != nil || logFile.Sync() != nil {
					http.Error(w, "the manifests' log cannot be written", http.StatusInternalServerError)
					return
				}
			}
			copyResponse(w, rec)
			return
		}
		inner.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return http.Serve(ln, handler)
}

// replayManifests puts and deletes again, in order, the manifests of the log.
func replayManifests(inner http.Handler, path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e manifestLogEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			break // a line cut by the kill: it was never acknowledged
		}
		req := httptest.NewRequest(e.Method, e.Path, bytes.NewReader(e.Body))
		if e.ContentType != "" {
			req.Header.Set("Content-Type", e.ContentType)
		}
		inner.ServeHTTP(httptest.NewRecorder(), req)
	}
	return sc.Err()
}

func copyResponse(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// registryProcess is the registry process as a test sees it.
type registryProcess struct {
	t    *testing.T
	dir  string
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// startRegistryProcess starts the registry process on a free loopback port and a new
// storage directory, and waits until it answers.
func startRegistryProcess(t *testing.T) *registryProcess {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rp := &registryProcess{t: t, dir: t.TempDir(), addr: addr}
	rp.start()
	t.Cleanup(rp.kill)
	return rp
}

func (rp *registryProcess) repo() string { return rp.addr + "/bothy/templates" }

// start starts the process on rp's address and storage directory.
func (rp *registryProcess) start() {
	rp.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), registryProcessEnv+"="+rp.dir, "BOTHY_TEST_REGISTRY_ADDR="+rp.addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		rp.t.Fatal(err)
	}
	rp.cmd, rp.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(rp.done)
	waitFor(rp.t, 30*time.Second, "the registry process to answer", func() bool {
		resp, err := http.Get("http://" + rp.addr + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// kill kills the process with SIGKILL and waits for it; a dead one is left.
func (rp *registryProcess) kill() {
	if rp.cmd == nil {
		return
	}
	_ = rp.cmd.Process.Kill()
	<-rp.done
	rp.cmd = nil
}

// setStall sets the stall ("push", "pull" or "" for none) and clears its signal.
func (rp *registryProcess) setStall(what string) {
	rp.t.Helper()
	for _, s := range []string{"push", "pull"} {
		_ = os.Remove(filepath.Join(rp.dir, "stalled-"+s))
	}
	if err := os.WriteFile(filepath.Join(rp.dir, "stall"), []byte(what), 0o600); err != nil {
		rp.t.Fatal(err)
	}
}

// waitStalled waits until a request stalled at what.
func (rp *registryProcess) waitStalled(what string) {
	rp.t.Helper()
	waitFor(rp.t, 2*time.Minute, "the registry to stall a "+what, func() bool {
		_, err := os.Stat(filepath.Join(rp.dir, "stalled-"+what))
		return err == nil
	})
}

// manifestStatus is the status of a GET of the manifest tag names; 0 when the registry
// does not answer.
func (rp *registryProcess) manifestStatus(tag string) int {
	resp, err := http.Get("http://" + rp.addr + "/v2/bothy/templates/manifests/" + tag)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
