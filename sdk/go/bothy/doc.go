// Package bothyd is the Go client of bothyd's REST API: the generated types of
// openapi/openapi.yaml (from [github.com/bothy/bothy/openapi/client]) with the parts a
// generator does not do well written by hand — the exec websocket as a [Stream] (output to
// read, stdin to write, resize, signal, the exit), files streamed both ways, waiting for a
// sandbox's state, the event stream, and errors that carry the problem's code.
//
// A [Client] is safe for concurrent use. It sends the token as `Authorization: Bearer` on
// every request, websockets and the event stream included (a Go client can set headers, so it
// never puts the token in a URL).
//
// # Errors
//
// An answer that is not a success is an [*APIError] with the problem's Code, Detail and HTTP
// status. Match it by code with errors.Is against a [Code] (the Err* values are the codes of
// the contract), or take it apart with errors.As:
//
//	_, err := c.Get(ctx, "nope")
//	if errors.Is(err, bothy.ErrSandboxNotFound) { ... }
//
// A server that cannot be reached at all is reported as an [*UnreachableError], which
// matches [ErrUnreachable].
//
// # Waiting
//
// [Client.Wait] asks the server's GET /v1/sandboxes/{id}/wait. A server older than that
// operation answers it with the route's not-found; Wait then follows /v1/events itself
// (subscribing before it reads the sandbox, so that no change falls between the two).
//
// # Secrets
//
// [Client.CreateSecret], [Client.RotateSecret], [Client.Secrets], [Client.GetSecret] and
// [Client.DeleteSecret] manage secrets, whose values no answer returns; a sandbox's
// NetworkPolicy.Secrets binds them to hosts (docs/secrets.md).
//
// # Port links
//
// [Client.CreatePortLink] makes a link that opens one port of a sandbox without the API
// token; its token and path are in that answer alone. [Client.PortLinks] lists a sandbox's
// (or a port's) live links without them, and [Client.RevokePortLink] revokes one
// (docs/network.md).
//
// # Webhooks and idempotent creates
//
// [Client.CreateWebhook], [Client.Webhooks], [Client.GetWebhook] and [Client.DeleteWebhook]
// manage webhooks; a receiver written in Go checks a delivery with [VerifyWebhook]
// (docs/webhooks.md). A context made by [WithIdempotencyKey] makes every create made with it
// carry that Idempotency-Key, so that repeating it returns the first answer:
//
//	ctx := bothy.WithIdempotencyKey(ctx, "build-42-create")
//	sb, err := c.Create(ctx, bothy.CreateOptions{ID: "build-42"}) // safe to repeat
//
// # Volumes
//
// [Client.CreateVolume], [Client.Volumes], [Client.GetVolume] and [Client.DeleteVolume]
// manage volumes, file systems of a fixed size that outlive sandboxes (docs/volumes.md);
// [CreateOptions.Volumes] mounts them into a new sandbox, and [Client.WriteVolumeFile],
// [Client.ReadVolumeFile], [Client.ListVolumeFiles], [Client.MakeVolumeDir] and
// [Client.RemoveVolumeFile] reach their files without any sandbox:
//
//	c.CreateVolume(ctx, "cache", 2048)
//	c.Create(ctx, bothy.CreateOptions{Start: true, Volumes: []bothy.VolumeMount{{Name: "cache", Path: "/cache"}}})
//
// # Images
//
// [Client.PullImage] starts a pull and returns at once; [Client.WaitImage] follows it by
// reading GET /v1/images/{name} until it ends, handing each reading to a callback
// ([PullProgress] sums its layers' bytes), and returns a [*PullError] for a pull that failed:
//
//	img, err := c.PullImage(ctx, "registry.example.com/library/busybox:1.36", bothy.PullOptions{Name: "busybox"})
//	if err == nil {
//		img, err = c.WaitImage(ctx, img.Name, func(i *bothy.Image) {
//			done, total, _, _ := bothy.PullProgress(i)
//			log.Printf("%d of %d bytes", done, total)
//		})
//	}
//
// [Client.ImportImage] streams an archive; [Client.DeleteImage] is refused with
// [ErrImageInUse] while a sandbox or a generation uses the image.
//
// # Operations newer than the generated client
//
// Pause, resume, the sandbox lifetime, wait and [Client.Metrics] are called by their paths
// whether or not the server knows them; an older server answers them with the route's
// not-found (or method-not-allowed), which [IsUnsupported] recognises.
package bothy
