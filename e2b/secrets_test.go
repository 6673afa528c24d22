package e2b

import (
	"encoding/json"
	"testing"

	"github.com/bothy/bothy/errcode"
)

func TestNetworkRulesBecomeBindings(t *testing.T) {
	t.Parallel()
	body := func(s string) *networkBody {
		var n networkBody
		if err := json.Unmarshal([]byte(s), &n); err != nil {
			t.Fatal(err)
		}
		return &n
	}
	deny := false
	p, err := networkPolicy(&deny, body(`{"allowOut":["api.example.com","*.example.org"],"rules":{
		"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.Api_Key}"}}}],
		"*.example.org":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.api_key}"}}},{}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Secrets) != 1 {
		t.Fatalf("bindings %+v", p.Secrets)
	}
	b := p.Secrets[0]
	if b.Secret != "api_key" || len(b.Hosts) != 2 || b.Header.Name != "Authorization" || b.Header.Value != "Bearer {value}" {
		t.Fatalf("binding %+v %+v", b, b.Header)
	}
	refused := map[string]string{
		"literal header":    `{"allowOut":["a.test"],"rules":{"a.test":[{"transform":{"headers":{"X":"static"}}}]}}`,
		"two references":    `{"allowOut":["a.test"],"rules":{"a.test":[{"transform":{"headers":{"X":"${e2b.secrets.a}${e2b.secrets.b}"}}}]}}`,
		"identity token":    `{"allowOut":["a.test"],"rules":{"a.test":[{"transform":{"headers":{"X":"${e2b.identity.tokens.aws}"}}}]}}`,
		"two templates":     `{"allowOut":["a.test","b.test"],"rules":{"a.test":[{"transform":{"headers":{"X":"${e2b.secrets.k}"}}}],"b.test":[{"transform":{"headers":{"Y":"${e2b.secrets.k}"}}}]}}`,
		"nothing reachable": `{"rules":{"a.test":[{"transform":{"headers":{"X":"${e2b.secrets.k}"}}}]}}`,
	}
	for name, s := range refused {
		if _, err := networkPolicy(&deny, body(s)); errcode.Of(err) != errcode.InvalidRequest {
			t.Errorf("%s: %v, want invalid-request", name, err)
		}
	}
}
