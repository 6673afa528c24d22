package router

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/bothy/bothy/naming"
)

// Webhooks through the router (docs/cluster.md, "Webhooks"). Each node delivers the events
// of its own sandboxes from its own durable outbox (package webhook), so a webhook made
// through the router must exist on every node, under one id: the router gives the id in the
// create (the contract's optional id; derived from the client's Idempotency-Key when there
// is one, so that a retry names the same id) and sends the create to every live node. A node
// that holds a webhook of that id with the same URL, events and secret answers it again, so a
// create is idempotent by its id. A create that some node refused or did not answer is
// undone on the nodes that made it, so it is never left half-made silently; when the undo
// fails too, the answer says which nodes hold it and that a repeat of the create (the same
// id) or a delete finishes it. Reads merge the nodes' records of the id (one webhook, its
// delivery state summed over the nodes), deletes go to every live node. The router never
// reads a secret (no node answers one) and never logs a create's body.

// maxWebhookCreateBytes bounds a webhook create's body: a URL of 2048 characters, 32 event
// types and a secret of 256 fit many times over.
const maxWebhookCreateBytes = 64 << 10

// serveWebhooks routes /v1/webhooks and below it.
func (rt *Router) serveWebhooks(w http.ResponseWriter, req *http.Request) {
	id, hasID := strings.CutPrefix(req.URL.Path, "/v1/webhooks/")
	switch {
	case req.URL.Path == "/v1/webhooks" && req.Method == http.MethodPost:
		rt.createWebhook(w, req)
	case req.URL.Path == "/v1/webhooks" && req.Method == http.MethodGet:
		rt.listWebhooks(w, req)
	case hasID && id != "" && !strings.Contains(id, "/") && req.Method == http.MethodGet:
		rt.getWebhook(w, req, id)
	case hasID && id != "" && !strings.Contains(id, "/") && req.Method == http.MethodDelete:
		rt.deleteWebhook(w, req)
	default:
		rt.anyNodeAnswers(w, req) // 404 or 405, as one node answers
	}
}

// webhookID is the id the router gives a create that names none: a function of the client's
// Idempotency-Key when it sent one (so that its retry, through any replica, names the same id
// and finds the webhook the first attempt made), else a new random one.
func webhookID(idempotencyKey string) string {
	if idempotencyKey == "" {
		return "wh-" + naming.RandomHex(8)
	}
	sum := sha256.Sum256([]byte("bothy-webhook-id\x00" + idempotencyKey))
	return "wh-" + hex.EncodeToString(sum[:8])
}

// createWebhook makes the webhook on every live node under one id, or on none.
func (rt *Router) createWebhook(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxWebhookCreateBytes+1))
	if err != nil || len(body) > maxWebhookCreateBytes {
		problem(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The webhook create is larger than %d bytes or could not be read; send a smaller one.", maxWebhookCreateBytes))
		return
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		// Not an object: the node refuses it as one node would (400), and makes nothing.
		rt.anyNodeAnswersWith(w, req, body)
		return
	}
	id := ""
	if raw, ok := fields["id"]; ok {
		_ = json.Unmarshal(raw, &id) // a wrong id is the nodes' to refuse
	} else {
		id = webhookID(req.Header.Get("Idempotency-Key"))
		fields["id"], _ = json.Marshal(id)
		if body, err = json.Marshal(fields); err != nil {
			problem(w, http.StatusInternalServerError, "internal", "The router could not write the create; try again.")
			return
		}
	}
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	names := liveNames(nodes)
	if len(names) == 0 {
		problem(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live; try again once one is.")
		return
	}
	// The id makes the create idempotent on each node; the client's Idempotency-Key is the
	// router's to honour, not each node's (a node's stored answer would outlive an undo).
	out := req.Clone(req.Context())
	out.Header.Del("Idempotency-Key")
	out.Header.Set("Content-Type", "application/json")
	var made []string
	var first *nodeAnswer
	for _, name := range names {
		status, hdr, b, err := rt.nodeCall(out, nodes[name], http.MethodPost, "/v1/webhooks", "", bytes.NewReader(body), rt.nodeAuth)
		a := nodeAnswer{node: name, status: status, header: hdr, body: b, err: err}
		if err == nil && status == http.StatusCreated {
			made = append(made, name)
			if first == nil {
				first = &a
			}
			continue
		}
		rt.failedWebhookCreate(w, req, nodes, made, id, a)
		return
	}
	first.pass(w)
}

// failedWebhookCreate answers a create that node a refused or did not answer after the nodes
// made had made it: it deletes the webhook there again (so a refusal leaves nothing behind,
// as on one node), and answers the node's refusal, or a 502 when it did not answer. When
// the undo fails too, the answer says where the webhook is left and how to finish.
func (rt *Router) failedWebhookCreate(w http.ResponseWriter, req *http.Request, nodes map[string]*nodeView, made []string, id string, a nodeAnswer) {
	if a.err != nil || a.status/100 == 5 {
		rt.log.Warn("router: a node did not make a webhook", "node", a.node, "webhook", id, "status", a.status, "err", a.err)
	}
	var left []string
	for _, name := range made {
		status, _, _, err := rt.nodeCall(req, nodes[name], http.MethodDelete, "/v1/webhooks/"+id, "", nil, rt.nodeAuth)
		if err != nil || (status != http.StatusNoContent && status != http.StatusNotFound) {
			rt.log.Warn("router: undoing a webhook's create on a node failed", "node", name, "webhook", id, "status", status, "err", err)
			left = append(left, name)
		}
	}
	switch {
	case len(left) > 0:
		problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf(
			"Node %q did not make the webhook %s, and the router could not undo it on %s, where it is now made: repeat the create with the same id (it is idempotent) to finish it, or delete it (DELETE /v1/webhooks/%s).",
			a.node, id, strings.Join(left, ", "), id))
	case a.err != nil || a.status/100 == 5:
		problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not make the webhook, so it was made on no node; try again.", a.node))
	default:
		a.pass(w) // the node's refusal (400, 409, 429), as one node gives it; nothing is left made
	}
}

// anyNodeAnswersWith sends req, with body, to the first live node, whose answer is the
// router's: for a request every node would answer alike (a body that is no JSON object).
func (rt *Router) anyNodeAnswersWith(w http.ResponseWriter, req *http.Request, body []byte) {
	nodes, name, ok := rt.firstLive(w, req)
	if !ok {
		return
	}
	out := req.Clone(req.Context())
	out.Header.Del("Idempotency-Key")
	status, hdr, b, err := rt.nodeCall(out, nodes[name], req.Method, req.URL.Path, req.URL.RawQuery, bytes.NewReader(body), rt.nodeAuth)
	if err != nil {
		problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer; try again.", name))
		return
	}
	nodeAnswer{node: name, status: status, header: hdr, body: b}.pass(w)
}

// webhookRecord is the part of a node's webhook record the merge reads; the rest passes as
// the first node gave it.
type webhookRecord struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	Delivery  struct {
		Pending       int64      `json:"pending"`
		Delivered     int64      `json:"delivered"`
		Failed        int64      `json:"failed"`
		Dropped       int64      `json:"dropped"`
		LastAttemptAt *time.Time `json:"last_attempt_at"`
		LastSuccessAt *time.Time `json:"last_success_at"`
		NextAttemptAt *time.Time `json:"next_attempt_at"`
	} `json:"delivery"`
}

// mergeWebhook merges the records of one webhook on several nodes: the first record (the
// URL, events and created_at are alike on every node: one create made them), with the
// delivery state of all of them. Counts are summed (each node delivers its own sandboxes'
// events); the last attempt, its status and error are the latest node's; the last success
// the latest; the next attempt the soonest.
func mergeWebhook(records []json.RawMessage) json.RawMessage {
	var out map[string]json.RawMessage
	if json.Unmarshal(records[0], &out) != nil {
		return records[0]
	}
	var delivery map[string]json.RawMessage
	if json.Unmarshal(out["delivery"], &delivery) != nil || delivery == nil {
		delivery = map[string]json.RawMessage{}
	}
	var sum webhookRecord
	var lastAttempt, lastSuccess, nextAttempt *time.Time
	for _, raw := range records {
		var r webhookRecord
		var d struct {
			Delivery map[string]json.RawMessage `json:"delivery"`
		}
		if json.Unmarshal(raw, &r) != nil || json.Unmarshal(raw, &d) != nil {
			continue
		}
		sum.Delivery.Pending += r.Delivery.Pending
		sum.Delivery.Delivered += r.Delivery.Delivered
		sum.Delivery.Failed += r.Delivery.Failed
		sum.Delivery.Dropped += r.Delivery.Dropped
		if t := r.Delivery.LastAttemptAt; t != nil && (lastAttempt == nil || t.After(*lastAttempt)) {
			lastAttempt = t
			for _, k := range []string{"last_attempt_at", "last_status", "last_error"} {
				if v, ok := d.Delivery[k]; ok {
					delivery[k] = v
				} else {
					delete(delivery, k)
				}
			}
		}
		if t := r.Delivery.LastSuccessAt; t != nil && (lastSuccess == nil || t.After(*lastSuccess)) {
			lastSuccess = t
			delivery["last_success_at"] = d.Delivery["last_success_at"]
		}
		if t := r.Delivery.NextAttemptAt; t != nil && (nextAttempt == nil || t.Before(*nextAttempt)) {
			nextAttempt = t
			delivery["next_attempt_at"] = d.Delivery["next_attempt_at"]
		}
	}
	delivery["pending"], _ = json.Marshal(sum.Delivery.Pending)
	delivery["delivered"], _ = json.Marshal(sum.Delivery.Delivered)
	delivery["failed"], _ = json.Marshal(sum.Delivery.Failed)
	delivery["dropped"], _ = json.Marshal(sum.Delivery.Dropped)
	out["delivery"], _ = json.Marshal(delivery)
	b, err := json.Marshal(out)
	if err != nil {
		return records[0]
	}
	return b
}

// getWebhook reads the webhook on every live node, merged; 404 when no live node holds it.
func (rt *Router) getWebhook(w http.ResponseWriter, req *http.Request, _ string) {
	found, ok := rt.readAnswers(w, req)
	if !ok {
		return
	}
	records := make([]json.RawMessage, 0, len(found))
	for _, a := range found {
		records = append(records, a.body)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(mergeWebhook(records)) //nolint:gosec // G705: the nodes' own records, merged
}

// listWebhooks merges every live node's page of the list (the same limit and cursor to
// each): one entry an id, in id order as a node lists, each merged as getWebhook merges it,
// cut at the limit (writePage). A live node that fails the list fails it.
func (rt *Router) listWebhooks(w http.ResponseWriter, req *http.Request) {
	nodes, ok := rt.readNodes(w, req, planeREST)
	if !ok {
		return
	}
	items, more, ok := rt.livePages(w, req, nodes, "webhook list")
	if !ok {
		return
	}
	byID := map[string][]json.RawMessage{}
	for _, raw := range items {
		var r webhookRecord
		if json.Unmarshal(raw, &r) != nil || r.ID == "" {
			continue
		}
		byID[r.ID] = append(byID[r.ID], raw)
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	writePage(w, ids, listLimit(req), more, func(id string) json.RawMessage { return mergeWebhook(byID[id]) })
}

// deleteWebhook deletes the webhook on every live node: 204 when each deleted it or did not
// hold it (404), and one deleted it; 404 when none held it; a node that fails it fails the
// call (502), the other nodes' deletes standing: repeat the delete, which then finishes it.
func (rt *Router) deleteWebhook(w http.ResponseWriter, req *http.Request) {
	answers, ok := rt.toEveryLiveNode(w, req, nil)
	if !ok {
		return
	}
	// A refusal passed on is a wrong id (400), which is every node's.
	passDelete(w, answers, func(a *nodeAnswer) bool {
		if a.err == nil && a.status/100 != 5 {
			return false
		}
		rt.log.Warn("router: a node did not delete a webhook", "node", a.node, "path", req.URL.Path, "status", a.status, "err", a.err)
		problem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not delete the webhook; the other nodes' deletes stand. Repeat the delete.", a.node))
		return true
	})
}
