package server

import (
	"encoding/json"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/routers"

	"github.com/bothy/bothy/errcode"
)

// The contract states two rules that OpenAPI 3.0 has no keyword for, as extensions of the
// schemas they belong to (issue 38), and the validator enforces them here, from the spec, so
// that no handler keeps a rule the spec does not say:
//   - x-first-item: the schema of an array's first item, beyond its items' (a command's program
//     is not empty: {minLength: 1});
//   - x-key-pattern: the pattern of a map's keys (labels' keys).

// extensionRules checks r's query parameters and its JSON body (nil when it has none) against
// the extension rules of route's operation. It runs after kin-openapi's validation, so the
// values are of their schemas' types.
func extensionRules(r *http.Request, route *routers.Route, body []byte) error {
	for _, params := range []openapi3.Parameters{route.PathItem.Parameters, route.Operation.Parameters} {
		for _, ref := range params {
			p := ref.Value
			if p == nil || p.In != openapi3.ParameterInQuery || p.Schema == nil || p.Schema.Value == nil {
				continue
			}
			if values := r.URL.Query()[p.Name]; len(values) > 0 && !firstItemOK(p.Schema.Value, values[0]) {
				return errcode.Invalid(p.Name, "The query parameter %q must not be empty in its first value (the program); name a program first.", p.Name)
			}
		}
	}
	if len(body) == 0 || route.Operation.RequestBody == nil || route.Operation.RequestBody.Value == nil {
		return nil
	}
	mt := route.Operation.RequestBody.Value.Content.Get("application/json")
	if mt == nil || mt.Schema == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil // kin-openapi has judged the body already
	}
	field, why := walkExtensions(mt.Schema.Value, v, "")
	if why == "" {
		return nil
	}
	if prefix, ok := route.Operation.RequestBody.Value.Extensions["x-field-prefix"].(string); ok {
		field = prefix + "." + field
	}
	return errcode.Invalid(field, "The request body field %q %s.", field, why)
}

// firstItemOK reports whether s's x-first-item, if it has one, holds for an array's first
// item, given as text.
func firstItemOK(s *openapi3.Schema, first string) bool {
	rule, ok := s.Extensions["x-first-item"].(map[string]any)
	if !ok {
		return true
	}
	minLen, ok := rule["minLength"].(float64)
	return !ok || utf8.RuneCountInString(first) >= int(minLen)
}

// walkExtensions checks v against the extension rules of s and of the schemas within it, and
// returns the field at fault (named as requestProblem names fields) and why, or "" and "".
func walkExtensions(s *openapi3.Schema, v any, field string) (string, string) {
	if s == nil {
		return "", ""
	}
	for _, sub := range s.AllOf {
		if f, why := walkExtensions(sub.Value, v, field); why != "" {
			return f, why
		}
	}
	switch v := v.(type) {
	case map[string]any:
		if pattern, ok := s.Extensions["x-key-pattern"].(string); ok {
			re := keyPattern(pattern)
			for _, k := range slices.Sorted(maps.Keys(v)) {
				if re == nil || !re.MatchString(k) {
					return field, "has a key that is not valid: keys must match " + pattern
				}
			}
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			item := v[k]
			sub := s.Properties[k]
			if sub == nil && s.AdditionalProperties.Schema != nil {
				sub = s.AdditionalProperties.Schema
			}
			if sub == nil {
				continue
			}
			name := k
			if field != "" {
				name = field + "." + k
			}
			if f, why := walkExtensions(sub.Value, item, name); why != "" {
				return f, why
			}
		}
	case []any:
		if len(v) > 0 {
			if first, ok := v[0].(string); ok && !firstItemOK(s, first) {
				return field, "must not be empty in its first item (the program); name a program first"
			}
		}
		if s.Items != nil {
			for i, item := range v {
				if f, why := walkExtensions(s.Items.Value, item, field+"["+strconv.Itoa(i)+"]"); why != "" {
					return f, why
				}
			}
		}
	}
	return "", ""
}

// keyPatterns caches the compiled x-key-pattern of each schema; the spec's patterns are few.
var keyPatterns sync.Map

func keyPattern(pattern string) *regexp.Regexp {
	if re, ok := keyPatterns.Load(pattern); ok {
		return re.(*regexp.Regexp)
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil
	}
	keyPatterns.Store(pattern, re)
	return re
}
