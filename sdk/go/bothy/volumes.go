package bothy

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/bothy/bothy/openapi/client"
)

// The volume types of the contract (docs/volumes.md).
type (
	Volume          = client.Volume
	VolumeMount     = client.VolumeMount
	VolumeFileEntry = client.VolumeFileEntry
)

func volumePath(name, rest string) string { return "/v1/volumes/" + url.PathEscape(name) + rest }

// CreateVolume makes a volume of sizeMB MiB (0: the server's default, 1024).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int) (*Volume, error) {
	body := map[string]any{"name": name}
	if sizeMB > 0 {
		body["size_mb"] = sizeMB
	}
	var v Volume
	if err := c.post(ctx, "/v1/volumes", nil, body, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Volumes lists every volume by name, following the pages to the end.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	return listAll[Volume](ctx, c, "/v1/volumes", url.Values{})
}

// GetVolume returns a volume, with the sandboxes that mount it.
func (c *Client) GetVolume(ctx context.Context, name string) (*Volume, error) {
	var v Volume
	if err := c.get(ctx, volumePath(name, ""), nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeleteVolume deletes a volume and its files; one that sandboxes mount is refused with
// [ErrVolumeInUse].
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	_, err := c.call(ctx, request{method: http.MethodDelete, path: volumePath(name, "")}, nil)
	return err
}

// WriteVolumeFile writes the file at path of the volume from r, streamed, making missing
// parent directories; a volume that fills answers [ErrVolumeFull].
func (c *Client) WriteVolumeFile(ctx context.Context, name, path string, r io.Reader) (*VolumeFileEntry, error) {
	var e VolumeFileEntry
	_, err := c.call(ctx, request{
		method: http.MethodPut, path: volumePath(name, "/files"), query: url.Values{"path": {path}},
		body: r, ctype: "application/octet-stream",
	}, &e)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// ReadVolumeFile opens the regular file at path of the volume for reading; the caller
// closes it.
func (c *Client) ReadVolumeFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return c.stream(ctx, request{method: http.MethodGet, path: volumePath(name, "/files"), query: url.Values{"path": {path}}})
}

// ListVolumeFiles lists the directory at path of the volume.
func (c *Client) ListVolumeFiles(ctx context.Context, name, path string) ([]VolumeFileEntry, error) {
	var list client.VolumeFileList
	if err := c.get(ctx, volumePath(name, "/files/list"), url.Values{"path": {path}}, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// MakeVolumeDir makes the directory at path of the volume, with its parents.
func (c *Client) MakeVolumeDir(ctx context.Context, name, path string) (*VolumeFileEntry, error) {
	var e VolumeFileEntry
	if err := c.post(ctx, volumePath(name, "/files/mkdir"), url.Values{"path": {path}}, nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// RemoveVolumeFile removes a file, a link or an empty directory of the volume; recursive
// removes a directory with everything in it.
func (c *Client) RemoveVolumeFile(ctx context.Context, name, path string, recursive bool) error {
	q := url.Values{"path": {path}, "recursive": {strconv.FormatBool(recursive)}}
	_, err := c.call(ctx, request{method: http.MethodDelete, path: volumePath(name, "/files"), query: q}, nil)
	return err
}
