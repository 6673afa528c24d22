// Package handlers implements the generated strict server interface of the v1 contract, one
// file per resource (sandboxes.go, exec.go, files.go, templates.go). Handlers translate HTTP
// requests into calls on the store and the supervisor, and their results back into response
// objects; nothing more. They return typed errors (errcode) and never write error responses
// themselves: the server package maps errors to problem+json in one place.
package handlers
