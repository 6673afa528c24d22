package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"testing"
)

// pagedNode serves GET path as a node pages a list: the names after the cursor in name
// order, at most limit of them (100 by default), the last name as the next cursor when more
// follow.
func pagedNode(t *testing.T, path, key string, names ...string) string {
	t.Helper()
	sorted := slices.Clone(names)
	sort.Strings(sorted)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path || r.Header.Get("Authorization") != "Bearer node-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		limit := 100
		if v := r.URL.Query().Get("limit"); v != "" {
			limit, _ = strconv.Atoi(v)
		}
		after := r.URL.Query().Get("cursor")
		var page struct {
			Items      []map[string]string `json:"items"`
			NextCursor string              `json:"next_cursor,omitempty"`
		}
		page.Items = []map[string]string{}
		for _, n := range sorted {
			if n <= after {
				continue
			}
			if len(page.Items) == limit {
				page.NextCursor = page.Items[len(page.Items)-1][key]
				break
			}
			page.Items = append(page.Items, map[string]string{key: n, "state": "ready"})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(page)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// walk pages through the router's list at limit and returns every key in page order.
func walk(t *testing.T, rt http.Handler, path, key string, limit int) []string {
	t.Helper()
	var keys []string
	cursor := ""
	for range 50 {
		target := path + "?limit=" + strconv.Itoa(limit)
		if cursor != "" {
			target += "&cursor=" + url.QueryEscape(cursor)
		}
		status, body := call(t, rt, "GET", target, "")
		var page struct {
			Items      []map[string]any `json:"items"`
			NextCursor string           `json:"next_cursor"`
		}
		if status != 200 || json.Unmarshal(body, &page) != nil {
			t.Fatalf("%s: %d %s", target, status, body)
		}
		if len(page.Items) > limit {
			t.Fatalf("%s: %d items, over the limit %d", target, len(page.Items), limit)
		}
		for _, it := range page.Items {
			keys = append(keys, it[key].(string))
		}
		if page.NextCursor == "" {
			return keys
		}
		cursor = page.NextCursor
	}
	t.Fatalf("%s: no last page after 50", path)
	return nil
}

// TestMergedListsPaged: the volume, image, webhook and secret lists through the router take
// limit and cursor as the sandbox list does: the same page asked of every live node, merged
// by key (a name the nodes share listed once), cut at the limit, the last key the next
// cursor; walking the pages gives every key once, in order, whatever the page size. (Before,
// the router merged whole lists and gave no cursor, so a page was over its limit.)
func TestMergedListsPaged(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path, key string
		nodes     [][]string
		want      []string
	}{
		{"/v1/volumes", "name", [][]string{{"a", "d", "e", "h"}, {"b", "c", "g"}, {"f"}},
			[]string{"a", "b", "c", "d", "e", "f", "g", "h"}},
		{"/v1/images", "name", [][]string{{"host", "alpine", "py_3.12"}, {"host", "busybox", "py_3.12"}, {"host"}},
			[]string{"alpine", "busybox", "host", "py_3.12"}},
		{"/v1/webhooks", "id", [][]string{{"wh-0000000000000001", "wh-0000000000000003"}, {"wh-0000000000000001", "wh-0000000000000002", "wh-0000000000000003"}},
			[]string{"wh-0000000000000001", "wh-0000000000000002", "wh-0000000000000003"}},
		// Secrets are on every node (a create writes each), names in byte order: upper case first.
		{"/v1/secrets", "name", [][]string{{"db", "API_KEY", "Token", "a_b"}, {"db", "API_KEY", "Token", "a_b", "z"}, {"API_KEY", "Zeta"}},
			[]string{"API_KEY", "Token", "Zeta", "a_b", "db", "z"}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			t.Parallel()
			nodes := map[string]string{}
			for i, names := range tt.nodes {
				nodes["node-"+strconv.Itoa(i)] = pagedNode(t, tt.path, tt.key, names...)
			}
			rt := routerOver(t, nodes)
			for _, limit := range []int{1, 2, 3, 100} {
				if got := walk(t, rt, tt.path, tt.key, limit); !slices.Equal(got, tt.want) {
					t.Errorf("limit %d: pages held %v, want %v", limit, got, tt.want)
				}
			}
		})
	}
}
