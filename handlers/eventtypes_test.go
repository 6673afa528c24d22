package handlers

import (
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/bothy/bothy/openapi"
)

// TestEventTypesAreTheContracts: the types a webhook may ask for are exactly the contract's
// EventType list and its WebhookEventType enum, so a type added to one (sleep and wake added
// two) cannot be missing from another.
func TestEventTypesAreTheContracts(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(openapi.Spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := doc.Components.Schemas["EventType"]
	if ref == nil || ref.Value == nil {
		t.Fatal("the contract has no EventType schema")
	}
	raw, ok := ref.Value.Extensions["x-extensible-enum"].([]any)
	if !ok {
		t.Fatalf("EventType's x-extensible-enum is %T", ref.Value.Extensions["x-extensible-enum"])
	}
	var spec []string
	for _, v := range raw {
		spec = append(spec, v.(string))
	}
	got := slices.Clone(EventTypes)
	slices.Sort(got)
	slices.Sort(spec)
	if !slices.Equal(got, spec) {
		t.Fatalf("handlers.EventTypes %v; the contract's EventType %v", got, spec)
	}
	hook := doc.Components.Schemas["WebhookEventType"]
	if hook == nil || hook.Value == nil {
		t.Fatal("the contract has no WebhookEventType schema")
	}
	var closed []string
	for _, v := range hook.Value.Enum {
		closed = append(closed, v.(string))
	}
	slices.Sort(closed)
	if !slices.Equal(closed, spec) {
		t.Fatalf("WebhookEventType's enum %v; EventType %v", closed, spec)
	}
}
