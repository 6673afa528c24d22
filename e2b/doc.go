// Package e2b serves E2B's API to E2B's own SDKs (npm and PyPI `e2b`), so that code written
// for E2B runs against bothyd with three environment variables set and no change
// (docs/e2b.md). It is a translation layer and nothing else: every sandbox, file and process
// it touches it reaches through the supervisor ([Supervisor]), never around it, so that every
// lifecycle rule of bothyd holds for E2B's calls as for bothyd's own.
//
// # Two planes on one listener
//
// E2B splits its API in two. The control plane (create, connect, list, kill, timeout, pause)
// lives at paths that bothyd's own API does not use (/sandboxes, /v2/sandboxes); the plane
// of the in-sandbox daemon, envd (files, processes), is addressed by the headers
// E2b-Sandbox-Id and E2b-Sandbox-Port, which the SDKs set on every envd call when
// E2B_SANDBOX_URL names one origin for all sandboxes. [Claims] tells the two apart from
// bothyd's own routes, so [Handler] mounts in front of bothyd's router on its listener, but
// behind the guards every route of that listener passes (package server: the Host and Origin
// checks, the body deadline, the per-client bounds); [IsUpload] and [IsStream] tell the server
// which calls are uploads and which are long-lived.
//
// # Credentials
//
// The control plane takes the API key in X-API-KEY; it is accepted when it is bothyd's
// token, or e2b_ followed by the token (E2B's SDKs insist on the prefix). The envd plane takes
// a per-sandbox access token in X-Access-Token: an HMAC of the sandbox's id under bothyd's
// token, handed out as envdAccessToken by create and connect. It is a pure function of the
// two, so nothing is stored, a restart keeps it valid, and a token for one sandbox opens no
// other. A server without a token checks neither.
//
// # Processes
//
// E2B runs several commands at once and re-attaches to them by pid or tag. These processes
// are started with [Supervisor.StartProcess], which takes no exec lock: bothyd's own exec
// keeps its one-at-a-time admission (sandbox-busy) and never waits for an E2B process, nor
// they for it. This package tracks the processes it started (pid, tag, output fanned out to
// every attached stream, stdin, signals) until they exit; the tracking is in bothyd's
// memory, so a restart of bothyd ends them with their control sessions.
package e2b
