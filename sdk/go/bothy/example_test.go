package bothy_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// A sandbox's life: create and start it, run a command, copy a file in and out, stop it and
// delete it.
func Example() {
	ctx := context.Background()
	c, err := bothy.New("http://127.0.0.1:7780", bothy.WithToken(os.Getenv("BOTHY_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Create(ctx, bothy.CreateOptions{ID: "demo", Start: true, Labels: map[string]string{"team": "grading"}}); err != nil {
		log.Fatal(err)
	}
	res, err := c.Exec(ctx, "demo", []string{"uname", "-a"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	if err := c.WriteFile(ctx, "demo", "/home/user/in.txt", strings.NewReader("hello\n")); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Stop(ctx, "demo", false, 0); err != nil {
		log.Fatal(err)
	}
	if err := c.Delete(ctx, "demo", false); err != nil {
		log.Fatal(err)
	}
}

// A command streamed over the exec websocket: write its stdin, read its output as it comes,
// and take its exit code.
func ExampleClient_ExecStream() {
	ctx := context.Background()
	c, _ := bothy.New("", bothy.WithToken(os.Getenv("BOTHY_TOKEN")))
	s, err := c.ExecStream(ctx, "demo", []string{"sh", "-c", "read x; echo got $x"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	_, _ = s.Write([]byte("hi\n"))
	_ = s.CloseStdin()
	exit, err := s.Copy(os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", exit.Code)
}

// Errors carry the problem's code: match it with errors.Is, or read it with errors.As.
func ExampleAPIError() {
	ctx := context.Background()
	c, _ := bothy.New("", bothy.WithToken(os.Getenv("BOTHY_TOKEN")))
	_, err := c.Start(ctx, "nope", 0)
	switch {
	case errors.Is(err, bothy.ErrSandboxNotFound):
		fmt.Println("no such sandbox")
	case errors.Is(err, bothy.ErrUnreachable):
		fmt.Println("is bothyd running?")
	}
	var apiErr *bothy.APIError
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.Code, apiErr.Detail)
	}
}

// Capture a stopped sandbox as a template generation and clone a sandbox from it.
func ExampleClient_Capture() {
	ctx := context.Background()
	c, _ := bothy.New("", bothy.WithToken(os.Getenv("BOTHY_TOKEN")))
	if _, err := c.CreateTemplate(ctx, "tools"); err != nil {
		log.Fatal(err)
	}
	gen, err := c.Capture(ctx, "tools", "builder", 0)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Clone(ctx, "tools", gen.ID, bothy.CreateOptions{ID: "clone1", Start: true}); err != nil {
		log.Fatal(err)
	}
}

// Wait until a sandbox is stopped.
func ExampleClient_Wait() {
	ctx := context.Background()
	c, _ := bothy.New("", bothy.WithToken(os.Getenv("BOTHY_TOKEN")))
	sb, err := c.Wait(ctx, "demo", "stopped", 30*time.Second)
	if errors.Is(err, bothy.ErrWaitTimeout) {
		log.Fatal("still not stopped")
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sb.State)
}
