// Package openapi holds bothyd's v1 contract, openapi.yaml, and the code generated from it:
// the strict server interface ([StrictServerInterface]) that package handlers implements,
// the chi routing glue that package server mounts, the models, and the spec itself as bytes
// ([Spec]) for serving and validation. The Go client lives in openapi/client.
//
// Nothing here is written by hand but the spec, the oapi-codegen configuration, this file,
// the spec embedding (spec.go) and its test. Change openapi.yaml, then run go generate; CI
// fails when the generated files differ from what go generate writes.
package openapi

//go:generate go tool oapi-codegen -config server.cfg.yaml openapi.yaml
//go:generate go tool oapi-codegen -config client/client.cfg.yaml openapi.yaml
//go:generate go tool oapi-codegen -config stream/stream.cfg.yaml openapi.yaml
