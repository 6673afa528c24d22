package bothy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWebhooksAndIdempotencyKey: the webhook calls reach their routes, a create made with
// WithIdempotencyKey carries the header (and a GET does not), and VerifyWebhook accepts a
// delivery signed as docs/webhooks.md says and refuses a changed or stale one.
func TestWebhooksAndIdempotencyKey(t *testing.T) {
	t.Parallel()
	var seen []string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+r.URL.Path+" key="+r.Header.Get("Idempotency-Key"))
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "POST":
			if !strings.Contains(string(body), `"secret":"s3cr3t-s3cr3t-s3cr3t"`) {
				t.Errorf("the create's body: %s", body)
			}
			w.WriteHeader(201)
			_, _ = io.WriteString(w, `{"id":"wh-0123456789abcdef","url":"https://x.example/","events":["sandbox.created"],"created_at":"2026-12-01T00:00:00Z","delivery":{"pending":0,"delivered":0,"failed":0,"dropped":0}}`)
		case r.Method == "GET" && r.URL.Path == "/v1/webhooks":
			_, _ = io.WriteString(w, `{"items":[]}`)
		case r.Method == "DELETE":
			w.WriteHeader(204)
		default:
			problem(w, 404, "webhook-not-found", "No such webhook.")
		}
	}))
	ctx := WithIdempotencyKey(context.Background(), "k-1")
	hook, err := c.CreateWebhook(ctx, WebhookOptions{URL: "https://x.example/", Events: []string{"sandbox.created"}, Secret: "s3cr3t-s3cr3t-s3cr3t"})
	if err != nil || hook.ID != "wh-0123456789abcdef" {
		t.Fatalf("CreateWebhook: %+v, %v", hook, err)
	}
	if list, err := c.Webhooks(ctx); err != nil || len(list) != 0 {
		t.Fatalf("Webhooks: %v, %v", list, err)
	}
	if _, err := c.GetWebhook(ctx, "wh-ffffffffffffffff"); !IsCode(err, ErrWebhookNotFound) {
		t.Fatalf("GetWebhook of none: %v", err)
	}
	if err := c.DeleteWebhook(context.Background(), hook.ID); err != nil {
		t.Fatal(err)
	}
	want := []string{"POST /v1/webhooks key=k-1", "GET /v1/webhooks key=", "GET /v1/webhooks/wh-ffffffffffffffff key=", "DELETE /v1/webhooks/wh-0123456789abcdef key="}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}

	secret, body := []byte("s3cr3t"), []byte(`{"seq":7,"type":"sandbox.created"}`)
	sign := func(ts int64, body []byte) http.Header {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(strconv.FormatInt(ts, 10) + "."))
		m.Write(body)
		return http.Header{"Bothy-Timestamp": {strconv.FormatInt(ts, 10)}, "Bothy-Signature": {"v1=" + hex.EncodeToString(m.Sum(nil))}}
	}
	now := time.Now().Unix()
	if !VerifyWebhook(secret, sign(now, body), body, 0) {
		t.Fatal("a good delivery does not verify")
	}
	if VerifyWebhook(secret, sign(now, body), []byte(`{"seq":8}`), 0) {
		t.Fatal("a changed body verifies")
	}
	if VerifyWebhook(secret, sign(now-3600, body), body, 0) {
		t.Fatal("an hour-old delivery verifies")
	}
}
