package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/secret"
)

// Secrets through the router (docs/cluster.md, "Secrets"). A secret is kept by each node in
// its own state root, encrypted under that node's key, and its value goes only to that
// node's egress proxy: a sandbox can spend a secret only on a node that holds it. So the
// router makes a secret the cluster's by writing it on every live node:
//
//   - a create goes to every live node, all or nothing: when any node refuses it or does not
//     answer, the router deletes it again from the nodes that took it in this call and says
//     so, so that a retry of the same request starts clean;
//   - a rotate goes to every live node and creates the secret, with the new value, on a live
//     node that lacks it (one that joined after the secret was made): a rotate is how a
//     secret reaches every node, and repeating it is harmless, so a rotate that some nodes
//     took and others did not is answered as an error that says so, to be repeated;
//   - a delete first reads the secret on every live node and is refused (secret-in-use,
//     naming the sandboxes of every node) while any sandbox binds it, then goes to every
//     live node, a node that does not hold it counting as done, so a repeat finishes a
//     delete that a node did not answer;
//   - reads (one secret, the list) ask every live node and merge by name: the bindings of
//     every node together (each node's sandboxes are its own). Nodes never return a value;
//     neither does the router, which reads a value only from a rotate's body, to create the
//     secret on a node that lacks it, and never logs a body.
//
// A node whose lease has lapsed is not written (a rotate after a leak must not wait for a
// dead host); a rotate or delete that such a node, listing the secret, missed answers 503
// node-lost naming it, to be repeated once it is back.
//
// Each node lists its secrets' names in its BothyNode's status.secrets (rewritten within a
// second of a create or delete), and a create of a sandbox that binds secrets is placed only
// on nodes that list them all (secretCandidates); the nodes this router wrote a secret on
// lately count as holding it before their status says so.

// maxSecretBody bounds the body of a secret's create or rotate through the router: a value
// is at most 8 KiB (secret.MaxValueBytes), its JSON escaping at most six times that.
const maxSecretBody = 64 << 10

// secretAPI is one API's secrets calls, bothy's (/v1/secrets) or E2B's (/secrets): the
// router's logic is the same for both, the paths, credentials and answers' shapes differ.
type secretAPI struct {
	pl   plane
	auth func(http.Header)
	// collection is the path of the list and the create; item and rotate the paths of one
	// secret's read and delete, and of its rotate (id as the client named it).
	collection   string
	item, rotate func(id string) string
	// name is the secret's name on a node for the id the client gave.
	name func(id string) string
	// list reads a node's list into its items; writeList answers the merged items. Only
	// E2B's list uses them (one page of at most 256, as E2B lists); bothy's list pages
	// (pageSecrets).
	list      func(body []byte) ([]json.RawMessage, error)
	writeList func(w http.ResponseWriter, items []json.RawMessage)
	// merge makes one record of a secret's records on several nodes.
	merge func(records []json.RawMessage) json.RawMessage
}

func (rt *Router) bothySecrets() *secretAPI {
	return &secretAPI{
		pl: planeREST, auth: rt.nodeAuth, collection: "/v1/secrets",
		item:   func(id string) string { return "/v1/secrets/" + id },
		rotate: func(id string) string { return "/v1/secrets/" + id + "/rotate" },
		name:   func(id string) string { return id },
		merge:  mergeSecret,
	}
}

func (rt *Router) e2bSecretsAPI() *secretAPI {
	return &secretAPI{
		pl: planeE2B, auth: rt.nodeAPIKey, collection: "/secrets",
		item:   func(id string) string { return "/secrets/" + id },
		rotate: func(id string) string { return "/secrets/" + id },
		// E2B's id is "sec_" and the name, and a node lower-cases a name (e2b/secrets.go).
		name: func(id string) string { return strings.ToLower(strings.TrimPrefix(id, "sec_")) },
		list: func(body []byte) ([]json.RawMessage, error) {
			var items []json.RawMessage
			err := json.Unmarshal(body, &items)
			return items, err
		},
		writeList: func(w http.ResponseWriter, items []json.RawMessage) { writeJSON(w, http.StatusOK, items) },
		merge:     mergeE2BSecret,
	}
}

// serveSecrets routes /v1/secrets and everything below it.
func (rt *Router) serveSecrets(w http.ResponseWriter, req *http.Request) {
	rt.routeSecrets(w, req, rt.bothySecrets(), strings.TrimPrefix(req.URL.Path, "/v1/secrets"))
}

// e2bSecrets routes E2B's /secrets and everything below it.
func (rt *Router) e2bSecrets(w http.ResponseWriter, req *http.Request) {
	rt.routeSecrets(w, req, rt.e2bSecretsAPI(), strings.TrimPrefix(req.URL.Path, "/secrets"))
}

func (rt *Router) routeSecrets(w http.ResponseWriter, req *http.Request, api *secretAPI, rest string) {
	var parts []string
	if rest != "" {
		parts = strings.Split(strings.TrimPrefix(rest, "/"), "/")
	}
	get, post, del := req.Method == http.MethodGet, req.Method == http.MethodPost, req.Method == http.MethodDelete
	one := len(parts) == 1 && parts[0] != ""
	switch {
	case rest == "" && get:
		rt.listSecrets(w, req, api)
	case rest == "" && post:
		rt.createSecret(w, req, api)
	case one && get:
		rt.readSecret(w, req, api, parts[0])
	case one && del:
		rt.deleteSecret(w, req, api, parts[0])
	case api.pl == planeREST && len(parts) == 2 && parts[0] != "" && parts[1] == "rotate" && post,
		api.pl == planeE2B && one && post:
		rt.rotateSecret(w, req, api, parts[0])
	default:
		// No such route: a live node answers as one node would (404, 405).
		nodes, name, ok := rt.firstLive(w, req)
		if ok {
			rt.proxyToNode(w, req, name, nodes[name], api.pl, req.URL.Path)
		}
	}
}

// readSecretBody reads a create's or rotate's body, bounded; false when it answered.
func readSecretBody(w http.ResponseWriter, req *http.Request, api *secretAPI) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxSecretBody+1))
	switch {
	case err != nil:
		api.pl.fail(w, http.StatusBadRequest, "invalid-request", "The request body could not be read; send it again.")
		return nil, false
	case len(body) > maxSecretBody:
		api.pl.fail(w, http.StatusRequestEntityTooLarge, "payload-too-large", fmt.Sprintf("The request body is over %d bytes; a secret's value is at most 8 KiB.", maxSecretBody))
		return nil, false
	}
	return body, true
}

// fanout sends one call to every live node in name order; false when it answered (no node
// can be read, or none is live).
func (rt *Router) fanout(w http.ResponseWriter, req *http.Request, api *secretAPI, method, path string, body []byte) ([]nodeAnswer, map[string]*nodeView, bool) {
	nodes, ok := rt.readNodes(w, req, api.pl)
	if !ok {
		return nil, nil, false
	}
	names := liveNames(nodes)
	if len(names) == 0 {
		api.pl.fail(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live; try again once one is.")
		return nil, nil, false
	}
	return rt.secretCall(req, api, nodes, names, method, path, body), nodes, true
}

// secretCall sends one call of api's to the nodes named, at once (callNodes), with api's
// credentials and, with a body, its JSON type (a rotate's value is sent as a create too).
func (rt *Router) secretCall(req *http.Request, api *secretAPI, nodes map[string]*nodeView, names []string, method, path string, body []byte) []nodeAnswer {
	return rt.callNodes(req, nodes, names, method, path, "", body, func(h http.Header) {
		api.auth(h)
		if body != nil {
			h.Set("Content-Type", "application/json")
		}
	})
}

// createSecret creates the secret on every live node, all or nothing (see the file's comment).
func (rt *Router) createSecret(w http.ResponseWriter, req *http.Request, api *secretAPI) {
	body, ok := readSecretBody(w, req, api)
	if !ok {
		return
	}
	var head struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(body, &head) // a body that does not parse is the nodes' to refuse
	name := head.Name
	if api.pl == planeE2B {
		name = strings.ToLower(name) // as a node stores E2B's names
	}
	answers, _, ok := rt.fanout(w, req, api, http.MethodPost, api.collection, body)
	if !ok {
		return
	}
	var took, exists, silent []string
	var first *nodeAnswer // the first node's answer that is not a create
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err == nil && a.status == http.StatusCreated:
			took = append(took, a.node)
			continue
		case a.err == nil && a.status == http.StatusConflict:
			exists = append(exists, a.node)
		case a.err != nil:
			silent = append(silent, a.node)
		}
		if first == nil {
			first = a
		}
		rt.log.Warn("router: a node did not create a secret", "node", a.node, "secret", name, "status", a.status, "err", a.err)
	}
	if first == nil {
		rt.rememberSecret(name, took)
		answerMerged(w, api, &answers[0], answers)
		return
	}
	if len(took) == 0 && len(silent) == 0 && (len(exists) == 0 || len(exists) == len(answers)) {
		// Every node that answered refused it alike (400, or 409 on every node), or the
		// first refusal is the nodes' own: nothing was made, nothing to undo.
		first.pass(w)
		return
	}
	kept := rt.undoCreate(req, api, name, took)
	switch {
	case len(kept) > 0:
		api.pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf(
			"The secret %q was created on %s but not on %s, and undoing it failed on %s: delete it through the router, then create it again.",
			name, nodeList(took), nodeList(others(answers, took)), nodeList(kept)))
	case len(silent) > 0:
		api.pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf(
			"%s did not answer the create of secret %q, so it was undone on the nodes that took it: a secret must be on every node. Try again (if a node made it after all, the retry says so).", capitalized(nodeList(silent)), name))
	case len(exists) > 0:
		api.pl.fail(w, http.StatusConflict, string(errcode.SecretExists), fmt.Sprintf(
			"A secret %q exists on %s but not on %s (a node that joined later, or a create cut short); this create was undone. Rotate it through the router, which sets one value on every live node and creates it where it is missing, or delete it through the router and create it again.",
			name, nodeList(exists), nodeList(others(answers, exists))))
	default:
		// A node's own refusal (limit-reached, storage-full): the others' creates undone.
		first.pass(w)
	}
}

// undoCreate deletes name from the nodes that created it in this call; it returns those
// where the delete failed.
func (rt *Router) undoCreate(req *http.Request, api *secretAPI, name string, took []string) []string {
	if len(took) == 0 {
		return nil
	}
	// The undo is done even when the client has gone: a half-made secret would stay.
	req = req.Clone(context.WithoutCancel(req.Context()))
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		return took
	}
	var kept []string
	for _, a := range rt.secretCall(req, api, nodes, took, http.MethodDelete, api.item(name), nil) {
		if a.err != nil || (a.status != http.StatusNoContent && a.status != http.StatusNotFound) {
			rt.log.Warn("router: undoing a secret's create on a node failed", "node", a.node, "secret", name, "status", a.status, "err", a.err)
			kept = append(kept, a.node)
		}
	}
	return kept
}

// rotateSecret rotates the secret on every live node, creating it with the new value on a
// live node that lacks it. A rotate cannot be undone (the old value is not known to the
// router, by design), but it can be repeated: one that some nodes took and others did not is
// answered as an error naming them, to be repeated.
func (rt *Router) rotateSecret(w http.ResponseWriter, req *http.Request, api *secretAPI, id string) {
	body, ok := readSecretBody(w, req, api)
	if !ok {
		return
	}
	name := api.name(id)
	answers, nodes, ok := rt.fanout(w, req, api, http.MethodPost, api.rotate(id), body)
	if !ok {
		return
	}
	var done, lacking []string
	var ok200, refused *nodeAnswer
	var records []nodeAnswer // the nodes' records of the secret with its new value
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err == nil && a.status == http.StatusOK:
			done = append(done, a.node)
			records = append(records, *a)
			if ok200 == nil {
				ok200 = a
			}
		case a.err == nil && a.status == http.StatusNotFound:
			lacking = append(lacking, a.node)
		default:
			if refused == nil {
				refused = a
			}
			rt.log.Warn("router: a node did not rotate a secret", "node", a.node, "secret", name, "status", a.status, "err", a.err)
		}
	}
	if ok200 == nil {
		// Rotated nowhere: the nodes' own answer (404 on every node, a 400 every node gives).
		switch {
		case refused != nil && refused.err == nil:
			refused.pass(w)
		case refused != nil:
			api.pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the rotate of secret %q; try again.", refused.node, name))
		default:
			answers[0].pass(w)
		}
		return
	}
	// Nodes that lack the secret get it, with the value this rotate sets.
	var failed []string
	if len(lacking) > 0 {
		created := rt.createOn(req, api, name, body, lacking)
		for _, a := range created {
			done = append(done, a.node)
			records = append(records, a)
		}
		for _, n := range lacking {
			if !slices.Contains(done, n) {
				failed = append(failed, n)
			}
		}
	}
	rt.rememberSecret(name, done)
	if refused != nil {
		failed = append(failed, refused.node)
	}
	if len(failed) > 0 {
		sort.Strings(done)
		api.pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf(
			"The secret %q now has the new value on %s but not on %s, which refused or did not answer: repeat the rotate (it sets the same value again) until every node takes it.",
			name, nodeList(done), nodeList(failed)))
		return
	}
	if lost := lostHolders(nodes, name); len(lost) > 0 {
		sort.Strings(done)
		w.Header().Set("Retry-After", "5")
		api.pl.fail(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf(
			"The secret %q now has the new value on %s, but %s, whose lease has lapsed, still holds the older value and its sandboxes send it: repeat the rotate once the node is back (it sets the same value again), or delete the BothyNode of a host that is gone for good.",
			name, nodeList(done), nodeList(lost)))
		return
	}
	answerMerged(w, api, ok200, records)
}

// answerMerged answers a write that every node took with the secret's record merged over
// the nodes' answers, as a read right after it gives it (the latest rotation of any node, the
// bindings of all); head's status and headers (a create's Location).
func answerMerged(w http.ResponseWriter, api *secretAPI, head *nodeAnswer, answers []nodeAnswer) {
	records := make([]json.RawMessage, 0, len(answers))
	for _, a := range answers {
		records = append(records, a.body)
	}
	copyHeader(w.Header(), head.header)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(head.status)
	_, _ = w.Write(api.merge(records)) //nolint:gosec // G705: the nodes' own records, merged
}

// createOn creates secret name, with the value of a rotate's body, on the nodes named; it
// returns the answers of those that took it. The value is held in memory for these calls
// alone.
func (rt *Router) createOn(req *http.Request, api *secretAPI, name string, rotateBody []byte, on []string) []nodeAnswer {
	var v struct {
		Value *string `json:"value"`
	}
	if json.Unmarshal(rotateBody, &v) != nil || v.Value == nil {
		return nil
	}
	body, err := json.Marshal(map[string]string{"name": name, "value": *v.Value})
	if err != nil {
		return nil
	}
	nodes, err := rt.nodes(req.Context())
	if err != nil {
		return nil
	}
	// The rotate's Idempotency-Key is the rotate's: nodeCall does not send it with these
	// creates.
	var took []nodeAnswer
	for _, a := range rt.secretCall(req, api, nodes, on, http.MethodPost, api.collection, body) {
		if a.err == nil && a.status == http.StatusCreated {
			took = append(took, a)
			rt.log.Info("router: a rotate created a secret on a node that lacked it", "node", a.node, "secret", name)
			continue
		}
		rt.log.Warn("router: a rotate could not create a secret on a node that lacked it", "node", a.node, "secret", name, "status", a.status, "err", a.err)
	}
	return took
}

// deleteSecret deletes the secret on every live node, once no sandbox of any node binds it.
func (rt *Router) deleteSecret(w http.ResponseWriter, req *http.Request, api *secretAPI, id string) {
	name := api.name(id)
	nodes, ok := rt.readNodes(w, req, api.pl)
	if !ok {
		return
	}
	names := liveNames(nodes)
	if len(names) == 0 {
		api.pl.fail(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live; try again once one is.")
		return
	}
	// First the bindings of every node: a delete that one node would refuse is refused
	// before any node deletes.
	if bound := rt.boundBy(req, nodes, names, name); len(bound) > 0 {
		api.pl.fail(w, http.StatusConflict, string(errcode.SecretInUse), fmt.Sprintf(
			"The secret %q is bound by the network policy of sandbox %s; delete those sandboxes or change their policies first. No node deleted it.", name, strings.Join(bound, ", ")))
		return
	}
	answers := rt.secretCall(req, api, nodes, names, http.MethodDelete, api.item(id), nil)
	var deleted []string
	var gone, refused *nodeAnswer
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err == nil && a.status == http.StatusNoContent:
			deleted = append(deleted, a.node)
		case a.err == nil && a.status == http.StatusNotFound:
			if gone == nil {
				gone = a
			}
		default:
			if refused == nil {
				refused = a
			}
			rt.log.Warn("router: a node did not delete a secret", "node", a.node, "secret", name, "status", a.status, "err", a.err)
		}
	}
	rt.forgetSecret(name)
	lost := lostHolders(nodes, name)
	switch {
	case refused != nil && len(deleted) > 0:
		status, code := http.StatusBadGateway, "unavailable"
		if refused.err == nil {
			status, code = refused.status, refused.code()
			if code == "" {
				code = "unavailable"
			}
		}
		api.pl.fail(w, status, code, fmt.Sprintf(
			"The secret %q was deleted on %s, but node %q refused or did not answer: repeat the delete once it answers (nodes that no longer hold it count as done).",
			name, nodeList(deleted), refused.node))
	case refused != nil && refused.err == nil:
		refused.pass(w)
	case refused != nil:
		api.pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the delete of secret %q; nothing was deleted. Try again.", refused.node, name))
	case len(lost) > 0:
		w.Header().Set("Retry-After", "5")
		api.pl.fail(w, http.StatusServiceUnavailable, CodeNodeLost, fmt.Sprintf(
			"The secret %q is deleted on the live nodes, but %s, whose lease has lapsed, still holds it: repeat the delete once the node is back (nodes that no longer hold it count as done), or delete the BothyNode of a host that is gone for good.",
			name, nodeList(lost)))
	case len(deleted) > 0:
		for i := range answers {
			if answers[i].status == http.StatusNoContent {
				answers[i].pass(w)
				return
			}
		}
	default:
		gone.pass(w)
	}
}

// boundBy are the sandboxes, of every live node, whose policy binds secret name, by bothy's
// read (E2B's carries no bindings); a node that does not answer adds none (its delete then
// fails, and says so).
func (rt *Router) boundBy(req *http.Request, nodes map[string]*nodeView, names []string, name string) []string {
	if !secret.ValidName(name) {
		return nil
	}
	var bound []string
	for _, a := range rt.secretCall(req, &secretAPI{auth: rt.nodeAuth}, nodes, names, http.MethodGet, "/v1/secrets/"+name, nil) {
		var s struct {
			Bindings []struct {
				Sandbox string `json:"sandbox"`
			} `json:"bindings"`
		}
		if a.err == nil && a.status == http.StatusOK && json.Unmarshal(a.body, &s) == nil {
			for _, b := range s.Bindings {
				bound = append(bound, b.Sandbox)
			}
		}
	}
	sort.Strings(bound)
	return bound
}

// lostHolders are the nodes whose lease has lapsed and whose BothyNode listed secret name
// when last written: a write through the router did not reach them. nodes must be the view
// the write was sent by: a node that came back between that view and a later read would be
// neither written nor found lost, and the write would be answered as done everywhere.
func lostHolders(nodes map[string]*nodeView, name string) []string {
	var out []string
	for n, v := range nodes {
		if !v.live && slices.Contains(v.obj.Status.Secrets, name) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// readSecret reads the secret on every live node, merged: 404 when no live node holds it.
func (rt *Router) readSecret(w http.ResponseWriter, req *http.Request, api *secretAPI, id string) {
	answers, _, ok := rt.fanout(w, req, api, http.MethodGet, api.item(id), nil)
	if !ok {
		return
	}
	var records []json.RawMessage
	var other *nodeAnswer
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err != nil || a.status/100 == 5:
			rt.log.Warn("router: a node's read of a secret failed", "node", a.node, "status", a.status, "err", a.err)
			api.pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the read; try again.", a.node))
			return
		case a.status == http.StatusOK:
			records = append(records, a.body)
		case other == nil:
			other = a
		}
	}
	if len(records) == 0 {
		other.pass(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(api.merge(records)) //nolint:gosec // G705: the nodes' own records, merged
}

// listSecrets lists every live node's secrets, merged by name, in name order. A node that
// fails the list fails it (no silent gap). Bothy's list pages (pageSecrets); E2B's is one
// page of at most 256 by design.
func (rt *Router) listSecrets(w http.ResponseWriter, req *http.Request, api *secretAPI) {
	if api.pl == planeREST {
		rt.pageSecrets(w, req, api)
		return
	}
	answers, _, ok := rt.fanout(w, req, api, http.MethodGet, api.collection, nil)
	if !ok {
		return
	}
	byName := map[string][]json.RawMessage{}
	for i := range answers {
		a := &answers[i]
		if a.err == nil && a.status/100 == 4 {
			a.pass(w)
			return
		}
		items, err := api.list(a.body)
		if a.err != nil || a.status != http.StatusOK || err != nil {
			rt.log.Warn("router: a node's list of secrets failed", "node", a.node, "status", a.status, "err", a.err)
			api.pl.fail(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("Node %q did not answer the list of secrets; try again.", a.node))
			return
		}
		addByName(byName, items)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	items := make([]json.RawMessage, 0, len(names))
	for _, n := range names {
		items = append(items, api.merge(byName[n]))
	}
	api.writeList(w, items)
}

// pageSecrets answers bothy's GET /v1/secrets: every live node's page (the same limit and
// cursor to each), merged by name as readSecret merges, in byte order of name as a node
// lists, cut at the limit (writePage). A node that fails the list fails it (no silent gap);
// no live node is 503, as for the other calls on secrets.
func (rt *Router) pageSecrets(w http.ResponseWriter, req *http.Request, api *secretAPI) {
	nodes, ok := rt.readNodes(w, req, api.pl)
	if !ok {
		return
	}
	if len(liveNames(nodes)) == 0 {
		api.pl.fail(w, http.StatusServiceUnavailable, CodeNoNode, "No node of the cluster is live; try again once one is.")
		return
	}
	items, more, ok := rt.livePages(w, req, nodes, "list of secrets")
	if !ok {
		return
	}
	byName := map[string][]json.RawMessage{}
	addByName(byName, items)
	keys := make([]string, 0, len(byName))
	for k := range byName {
		keys = append(keys, k)
	}
	writePage(w, keys, listLimit(req), more, func(k string) json.RawMessage { return api.merge(byName[k]) })
}

// addByName files each of a node's list items under its name.
func addByName(byName map[string][]json.RawMessage, items []json.RawMessage) {
	for _, raw := range items {
		var head struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(raw, &head) == nil && head.Name != "" {
			byName[head.Name] = append(byName[head.Name], raw)
		}
	}
}

// mergeSecret merges one secret's records (bothy's Secret) from several nodes: the earliest
// creation, the latest rotation, and the bindings of every node (each node's sandboxes are
// its own), by sandbox.
func mergeSecret(records []json.RawMessage) json.RawMessage {
	type use struct {
		Sandbox string   `json:"sandbox"`
		Hosts   []string `json:"hosts"`
	}
	bindings := []use{}
	out := mergeTimes(records, "created_at", "rotated_at", func(s map[string]json.RawMessage) {
		var b []use
		_ = json.Unmarshal(s["bindings"], &b)
		bindings = append(bindings, b...)
	})
	if out == nil {
		return records[0]
	}
	sort.Slice(bindings, func(i, j int) bool { return bindings[i].Sandbox < bindings[j].Sandbox })
	out["bindings"], _ = json.Marshal(bindings)
	return marshalOr(out, records[0])
}

// mergeE2BSecret merges one secret's records in E2B's shape: the earliest creation, the
// latest update, the highest version (a node that joined later counts fewer).
func mergeE2BSecret(records []json.RawMessage) json.RawMessage {
	version := 0
	out := mergeTimes(records, "createdAt", "updatedAt", func(s map[string]json.RawMessage) {
		var v int
		if json.Unmarshal(s["currentVersion"], &v) == nil && v > version {
			version = v
		}
	})
	if out == nil {
		return records[0]
	}
	out["currentVersion"], _ = json.Marshal(version)
	return marshalOr(out, records[0])
}

// mergeTimes merges several nodes' records of one item (JSON objects) into the first that
// parses, with the earliest time of its field first and the latest of its field last; each
// sees every record that parses, for what else the caller merges. nil when none parses.
func mergeTimes(records []json.RawMessage, first, last string, each func(map[string]json.RawMessage)) map[string]json.RawMessage {
	var out map[string]json.RawMessage
	var earliest, latest time.Time
	for _, raw := range records {
		var s map[string]json.RawMessage
		if json.Unmarshal(raw, &s) != nil {
			continue
		}
		if out == nil {
			out = s
		}
		var f, l time.Time
		if json.Unmarshal(s[first], &f) == nil && (earliest.IsZero() || f.Before(earliest)) {
			earliest = f
		}
		if json.Unmarshal(s[last], &l) == nil && l.After(latest) {
			latest = l
		}
		each(s)
	}
	if out == nil {
		return nil
	}
	if !earliest.IsZero() {
		out[first], _ = json.Marshal(earliest)
	}
	if !latest.IsZero() {
		out[last], _ = json.Marshal(latest)
	}
	return out
}

// marshalOr is the JSON of out, or fallback when it cannot be made.
func marshalOr(out map[string]json.RawMessage, fallback json.RawMessage) json.RawMessage {
	merged, err := json.Marshal(out)
	if err != nil {
		return fallback
	}
	return merged
}

// nodeList names nodes for a message: "node \"a\"", "nodes \"a\", \"b\"", "no node".
func nodeList(names []string) string {
	switch len(names) {
	case 0:
		return "no node"
	case 1:
		return fmt.Sprintf("node %q", names[0])
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return "nodes " + strings.Join(q, ", ")
}

// capitalized is s with its first letter upper-cased, to start a sentence.
func capitalized(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// others are the nodes of answers not in names.
func others(answers []nodeAnswer, names []string) []string {
	var out []string
	for _, a := range answers {
		if !slices.Contains(names, a.node) {
			out = append(out, a.node)
		}
	}
	return out
}

// secretKey is a secret's key on one node in the router's recent placements, apart from
// sandbox ids and volumes ("secret:" cannot start either).
func secretKey(name, node string) string { return "secret:" + name + "/" + node }

// rememberSecret keeps that nodes hold secret name, until their BothyNodes list it (a node
// rewrites its status within a second of a create): a create binding it, sent at once,
// must find them.
func (rt *Router) rememberSecret(name string, nodes []string) {
	for _, n := range nodes {
		rt.remember(secretKey(name, n), n)
	}
}

// forgetSecret drops what this router remembers of secret name on any node.
func (rt *Router) forgetSecret(name string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for k := range rt.recent {
		if strings.HasPrefix(k, "secret:"+name+"/") {
			delete(rt.recent, k)
		}
	}
}

// holdsSecret says whether node n (named name) holds secret s: its status lists it, or this
// router wrote it there lately.
func (rt *Router) holdsSecret(name string, n *nodeView, s string) bool {
	return slices.Contains(n.obj.Status.Secrets, s) || rt.recentNode(secretKey(s, name)) != ""
}

// secretCandidates narrows a create's candidate nodes to those that hold every secret it
// binds. When some live node holds each secret but no candidate holds them all (a node that
// joined after a secret was made lacks it), it says so in noRoom, with no candidate left;
// when a secret is on no live node at all, the candidates stay, and the node chosen refuses
// the create (404 secret-not-found) as one node would.
func (rt *Router) secretCandidates(nodes, candidates map[string]*nodeView, secrets []string, noRoom string) (map[string]*nodeView, string) {
	if len(secrets) == 0 {
		return candidates, noRoom
	}
	for _, s := range secrets {
		held := false
		for name, n := range nodes {
			if n.live && rt.holdsSecret(name, n, s) {
				held = true
				break
			}
		}
		if !held {
			return candidates, noRoom
		}
	}
	out := map[string]*nodeView{}
	for name, n := range candidates {
		all := true
		for _, s := range secrets {
			if !rt.holdsSecret(name, n, s) {
				all = false
				break
			}
		}
		if all {
			out[name] = n
		}
	}
	list := strings.Join(secrets, ", ")
	if len(out) == 0 {
		return out, fmt.Sprintf("No node that could take this sandbox holds every secret its policy binds (%s): a node that joined after a secret was made lacks it. Rotate the secrets through the router, which gives every live node their value, then create the sandbox again.", list)
	}
	return out, fmt.Sprintf("No node that holds the secrets this sandbox binds (%s) can take it now: each is full, cordoned, draining, unhealthy or lost. Rotate the secrets through the router to give them to every live node, delete sandboxes, or try again later.", list)
}

// createSecrets are the secrets a create of bothy's API binds: the keys of network.secrets.
func createSecrets(body []byte) []string {
	var cr struct {
		Network *struct {
			Secrets map[string]json.RawMessage `json:"secrets"`
		} `json:"network"`
	}
	if json.Unmarshal(body, &cr) != nil || cr.Network == nil {
		return nil
	}
	out := make([]string, 0, len(cr.Network.Secrets))
	for name := range cr.Network.Secrets {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// e2bSecretRef is E2B's reference to a secret in a rule's header transform (e2b/secrets.go).
var e2bSecretRef = regexp.MustCompile(`\$\{e2b\.secrets\.([^}]*)\}`)

// e2bCreateSecrets are the secrets an E2B create binds: those its network.rules' header
// transforms name, lower-cased as a node names them.
func e2bCreateSecrets(body []byte) []string {
	var cr struct {
		Network *struct {
			Rules map[string][]struct {
				Transform *struct {
					Headers map[string]string `json:"headers"`
				} `json:"transform"`
			} `json:"rules"`
		} `json:"network"`
	}
	if json.Unmarshal(body, &cr) != nil || cr.Network == nil {
		return nil
	}
	var out []string
	for _, rules := range cr.Network.Rules {
		for _, r := range rules {
			if r.Transform == nil {
				continue
			}
			for _, v := range r.Transform.Headers {
				for _, m := range e2bSecretRef.FindAllStringSubmatch(v, -1) {
					if n := strings.ToLower(m[1]); !slices.Contains(out, n) {
						out = append(out, n)
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out
}
