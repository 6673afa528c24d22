package handlers

import (
	"net/http"
	"net/url"
	"testing"
)

// TestStripCredentials: every access_token parameter, however its name is escaped, and the
// Authorization headers are removed; the service's own parameters pass as they came.
func TestStripCredentials(t *testing.T) {
	t.Parallel()
	tests := []struct{ query, want string }{
		{"x=1&access_token=T&y=%2F", "x=1&y=%2F"},
		{"access%5Ftoken=T", ""},
		{"access%255Ftoken=T&z", "z"},
		{"ACCESS_TOKEN=T&a=b", "a=b"},
		{"access_token+=T", ""},
		{"access_token", ""},
		{"%zz=1&b", "%zz=1&b"},
		{"access%zz_token=T&b", "b"},
		{"not_access_token=1&access_tokens=2", "not_access_token=1&access_tokens=2"},
		{"q=access_token", "q=access_token"},
	}
	for _, tt := range tests {
		r := &http.Request{URL: &url.URL{Path: "/", RawQuery: tt.query}, Header: http.Header{
			"Authorization": {"Bearer T"}, "Proxy-Authorization": {"Basic T"}, "X-Kept": {"1"}}}
		stripCredentials(r)
		if r.URL.RawQuery != tt.want {
			t.Errorf("%q: the service gets %q, want %q", tt.query, r.URL.RawQuery, tt.want)
		}
		if r.Header.Get("Authorization") != "" || r.Header.Get("Proxy-Authorization") != "" || r.Header.Get("X-Kept") != "1" {
			t.Errorf("%q: headers after stripping: %v", tt.query, r.Header)
		}
	}
}
