// Package handlers implements the generated strict server interface of the v1 contract, one
// file per resource (sandboxes.go, exec.go, files.go, templates.go), and the exec websocket
// (stream.go). Handlers translate HTTP requests into calls on the supervisor, through the
// [Supervisor] interface and the supervisor's own types, and their results back into response
// objects; nothing more. They reach no store, runtime or agent but through it, so that they
// can be tested against a fake. They return typed errors (errcode) and never write error
// responses themselves: the server package maps errors to problem+json in one place.
package handlers
