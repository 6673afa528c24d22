package bothy

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/bothy/bothy/openapi/client"
)

// The port link types of the contract (docs/ports.md): a link as made, with its token and
// path, and as listed, without them.
type (
	PortLink     = client.PortLink
	PortLinkInfo = client.PortLinkInfo
)

func portLinksPath(id string, port int) string {
	return sandboxPath(id, "/ports/", strconv.Itoa(port), "/links")
}

// CreatePortLink makes a link that opens port of the sandbox to whoever holds it, without the
// API token, for ttl (0: the server's default, an hour). Its token and path are in this answer
// alone: no list shows them again.
func (c *Client) CreatePortLink(ctx context.Context, id string, port int, ttl time.Duration) (*PortLink, error) {
	var body client.PortLinkRequest
	if ttl > 0 {
		s := int(ttl / time.Second)
		body.TTLS = &s
	}
	var l PortLink
	if err := c.post(ctx, portLinksPath(id, port), nil, body, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// PortLinks lists the live links of port of the sandbox, oldest first, or of every port
// when port is 0; without their tokens.
func (c *Client) PortLinks(ctx context.Context, id string, port int) ([]PortLinkInfo, error) {
	path := sandboxPath(id, "/links")
	if port != 0 {
		path = portLinksPath(id, port)
	}
	var list client.PortLinkList
	if err := c.get(ctx, path, nil, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// RevokePortLink revokes a link: its token stops working at once (ErrLinkNotFound when
// there is no such live link).
func (c *Client) RevokePortLink(ctx context.Context, id string, port int, link string) error {
	_, err := c.call(ctx, request{method: http.MethodDelete, path: portLinksPath(id, port) + "/" + url.PathEscape(link)}, nil)
	return err
}
