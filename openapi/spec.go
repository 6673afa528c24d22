package openapi

import _ "embed"

// Spec is openapi.yaml as written, served by the server at /openapi.yaml and loaded by its
// request validation. Callers must not modify it.
//
//go:embed openapi.yaml
var Spec []byte
