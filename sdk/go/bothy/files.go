package bothy

import (
	"context"
	"io"
	"net/http"
	"net/url"
)

// WriteFile creates or replaces the file at path (absolute, inside the sandbox) with what r
// holds, streamed; missing parent directories are created.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader) error {
	_, err := c.call(ctx, request{
		method: http.MethodPut, path: sandboxPath(id, "/files"), query: url.Values{"path": {path}},
		body: r, ctype: "application/octet-stream",
	}, nil)
	return err
}

// ReadFile opens the file at path for reading as it arrives; the caller closes it. A file
// that shrank while it was sent ends in an error, not a short read taken for the whole.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	return c.stream(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/files"), query: url.Values{"path": {path}}})
}

// ListFiles lists the directory at path.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]FileEntry, error) {
	var list struct {
		Items []FileEntry `json:"items"`
	}
	if err := c.get(ctx, sandboxPath(id, "/files/list"), url.Values{"path": {path}}, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// RemoveFile removes a file or an empty directory.
func (c *Client) RemoveFile(ctx context.Context, id, path string) error {
	_, err := c.call(ctx, request{method: http.MethodDelete, path: sandboxPath(id, "/files"), query: url.Values{"path": {path}}}, nil)
	return err
}
