package store

import (
	"bufio"
	"fmt"
	"testing"
	"time"
)

// BenchmarkLockUnlock measures an uncontended lock-existing and unlock of a provisioned sandbox.
func BenchmarkLockUnlock(b *testing.B) {
	s := newStore(b)
	provision(b, s, "a")
	ctx := timeout(b, time.Hour)
	b.ResetTimer()
	for b.Loop() {
		l, err := s.LockExisting(ctx, "a")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProvisionDeprovision measures a whole cycle: lock for provision, write the
// configuration record (durably), deprovision.
func BenchmarkProvisionDeprovision(b *testing.B) {
	s := newStore(b)
	ctx := timeout(b, time.Hour)
	c := config("a")
	for b.Loop() {
		l, err := s.LockForProvision(ctx, "a")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.WriteConfig(c); err != nil {
			b.Fatal(err)
		}
		if err := l.Deprovision(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkContendedThroughput measures lock and unlock while another process does the same
// on the same sandbox as fast as it can. The figure is mostly uncontended: a process that just
// released tends to win the next attempt while the other sleeps until its next retry.
func BenchmarkContendedThroughput(b *testing.B) {
	s := newStore(b)
	provision(b, s, "a")
	cmd := helperCmd(b, "hammer", s.Root(), "a")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "started\n" {
		b.Fatalf("hammer said %q, %v", line, err)
	}
	ctx := timeout(b, time.Hour)
	b.ResetTimer()
	for b.Loop() {
		l, err := s.LockExisting(ctx, "a")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("hammer: %v", err)
	}
}

// BenchmarkContendedHandoff measures the lock passing between two processes that each wait
// for it: one operation is two handoffs (to the other process and back), each from the moment
// the holder releases a lock that the other is known to be waiting for until the other holds
// it. A waiter notices a release at its next retry, so a handoff takes up to the 25 ms retry
// interval; the figure is dominated by that interval, by design.
func BenchmarkContendedHandoff(b *testing.B) {
	s := newStore(b)
	provision(b, s, "a")
	cmd := helperCmd(b, "pingpong", s.Root(), "a")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	out := bufio.NewReader(stdout)
	expect := func(want string) {
		if line, err := out.ReadString('\n'); err != nil || line != want+"\n" {
			b.Fatalf("other process said %q, %v; want %q", line, err, want)
		}
	}
	// When this process finds the lock busy, it tells the other to release.
	signalled := false
	s.testHook = func(point string) {
		if point == hookBusy && !signalled {
			signalled = true
			fmt.Fprintln(stdin, "release")
		}
	}
	ctx := timeout(b, time.Hour)
	l, err := s.LockExisting(ctx, "a")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		fmt.Fprintln(stdin, "go")
		expect("waiting")
		if err := l.Unlock(); err != nil {
			b.Fatal(err)
		}
		expect("got")
		signalled = false
		if l, err = s.LockExisting(ctx, "a"); err != nil {
			b.Fatal(err)
		}
		if !signalled {
			b.Fatal("took the lock back without waiting for it")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(2*b.N), "ms/handoff")
	l.Unlock()
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("other process: %v", err)
	}
}
