package bothy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/bothy/bothy/openapi/client"
)

// The image types of the contract.
type (
	Image      = client.Image
	ImageLayer = client.ImageLayer
	ImageState = client.ImageState
)

// The states of an image.
const (
	ImageReady   ImageState = "ready"
	ImagePulling ImageState = "pulling"
	ImageFailed  ImageState = "failed"
)

func imagePath(name string) string { return "/v1/images/" + url.PathEscape(name) }

// PullOptions are the optional parts of a pull.
type PullOptions struct {
	// Name is the local name of the image; "" lets the server choose one from the
	// reference (the repository's last element, and -<tag> unless latest).
	Name string `json:"name,omitempty"`
	// Platform is "os/arch[/variant]"; the server accepts only its own.
	Platform string `json:"platform,omitempty"`
}

// PullImage starts pulling ref and returns the image at once, in state [ImagePulling] (or
// [ImageReady] when nothing was left to fetch). Follow the pull with [Client.WaitImage].
func (c *Client) PullImage(ctx context.Context, ref string, o PullOptions) (*Image, error) {
	body := struct {
		Ref string `json:"ref"`
		PullOptions
	}{ref, o}
	var img Image
	if err := c.post(ctx, "/v1/images", nil, body, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// ImportImage imports r, a `docker save` archive or an OCI image layout as a tar (plain,
// gzip or zstd), as the image name. The body is streamed as it is read; the server checks
// every blob's digest as it goes.
func (c *Client) ImportImage(ctx context.Context, name string, r io.Reader) (*Image, error) {
	var img Image
	_, err := c.call(ctx, request{method: http.MethodPut, path: imagePath(name), body: r, ctype: "application/octet-stream"}, &img)
	if err != nil {
		return nil, err
	}
	return &img, nil
}

// Images lists every image by name, following the pages to the end: host, the directories
// under the state root's images/ and the OCI images, the pulls in progress and the failed
// ones included.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	return listAll[Image](ctx, c, "/v1/images", url.Values{})
}

// Image reads an image; while it is pulled, its layers carry the bytes done and total.
func (c *Client) Image(ctx context.Context, name string) (*Image, error) {
	var img Image
	if err := c.get(ctx, imagePath(name), nil, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// DeleteImage deletes an OCI image; while a sandbox or a generation uses it the server
// refuses with [ErrImageInUse], naming them.
func (c *Client) DeleteImage(ctx context.Context, name string) error {
	_, err := c.call(ctx, request{method: http.MethodDelete, path: imagePath(name)}, nil)
	return err
}

// PullPollInterval is how often [Client.WaitImage] reads the image while it is pulled.
const PullPollInterval = 250 * time.Millisecond

// WaitImage reads the image until it is no longer pulling and returns it; progress, when
// not nil, is called with every reading (the last one included). A pull that failed is
// returned with a [*PullError] holding the server's reason.
func (c *Client) WaitImage(ctx context.Context, name string, progress func(*Image)) (*Image, error) {
	tick := time.NewTicker(PullPollInterval)
	defer tick.Stop()
	for {
		img, err := c.Image(ctx, name)
		if err != nil {
			return nil, err
		}
		if progress != nil {
			progress(img)
		}
		switch img.State {
		case ImageReady:
			return img, nil
		case ImageFailed:
			reason := "no reason given"
			if img.Error != nil {
				reason = *img.Error
			}
			return img, &PullError{Image: name, Reason: reason}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// PullError is a pull that the server ran and that failed.
type PullError struct {
	Image  string
	Reason string
}

func (e *PullError) Error() string {
	return fmt.Sprintf("the pull of %s failed: %s", e.Image, e.Reason)
}

// PullProgress sums an image's layers: the bytes read of the blobs whose size is known, their
// total, and how many layers are complete (downloaded, or present already) of how many.
func PullProgress(img *Image) (done, total int64, layersDone, layers int) {
	if img.Layers == nil {
		return 0, 0, 0, 0
	}
	for _, l := range *img.Layers {
		layers++
		var d, t int64 = 0, -1
		if l.BytesDone != nil {
			d = *l.BytesDone
		}
		if l.BytesTotal != nil {
			t = *l.BytesTotal
		}
		present := l.Present != nil && *l.Present
		if present || img.State == ImageReady || (t >= 0 && d >= t) {
			layersDone++
		}
		if t >= 0 && !present {
			done += d
			total += t
		}
	}
	return done, total, layersDone, layers
}
