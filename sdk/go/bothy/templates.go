package bothy

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

func templatePath(name string, rest ...string) string {
	p := "/v1/templates/" + url.PathEscape(name)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// CreateTemplate makes an empty template; capture generations into it with [Client.Capture].
func (c *Client) CreateTemplate(ctx context.Context, name string) (*Template, error) {
	var t Template
	if err := c.post(ctx, "/v1/templates", nil, map[string]string{"name": name}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Templates lists every template.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	return listAll[Template](ctx, c, "/v1/templates", url.Values{})
}

// GetTemplate reads a template.
func (c *Client) GetTemplate(ctx context.Context, name string) (*Template, error) {
	var t Template
	if err := c.get(ctx, templatePath(name), nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTemplate retires every generation of the template and removes it. With drain, leased
// generations are tombstoned now and go with their last lease; the result then says pending.
func (c *Client) DeleteTemplate(ctx context.Context, name string, drain bool) (pending bool, err error) {
	q := url.Values{}
	if drain {
		q.Set("drain", "true")
	}
	status, err := c.call(ctx, request{method: http.MethodDelete, path: templatePath(name), query: q}, nil)
	return status == http.StatusAccepted, err
}

// Capture captures the stopped sandbox as a new generation of template.
func (c *Client) Capture(ctx context.Context, template, sandbox string, timeout time.Duration) (*Generation, error) {
	var g Generation
	body := map[string]string{"sandbox": sandbox}
	if err := c.post(ctx, templatePath(template)+"/generations", timeoutQuery(timeout), body, &g); err != nil {
		return nil, err
	}
	return &g, nil
}

// Clone creates a sandbox from template's generation gen ("" for the newest eligible one);
// o's Template and Generation are set from the arguments.
func (c *Client) Clone(ctx context.Context, template, gen string, o CreateOptions) (*Sandbox, error) {
	o.Template, o.Generation, o.Image = template, gen, ""
	return c.Create(ctx, o)
}

// Generations lists a template's generations, newest first.
func (c *Client) Generations(ctx context.Context, template string) ([]Generation, error) {
	return listAll[Generation](ctx, c, templatePath(template)+"/generations", url.Values{})
}

// GetGeneration reads a generation, with its eligibility now.
func (c *Client) GetGeneration(ctx context.Context, template, gen string) (*Generation, error) {
	var g Generation
	if err := c.get(ctx, templatePath(template, "generations", gen), nil, &g); err != nil {
		return nil, err
	}
	return &g, nil
}

// Tombstone quarantines a generation: no new clones; existing ones keep working.
func (c *Client) Tombstone(ctx context.Context, template, gen string) (*Generation, error) {
	var g Generation
	if err := c.post(ctx, templatePath(template, "generations", gen, "tombstone"), nil, nil, &g); err != nil {
		return nil, err
	}
	return &g, nil
}

// Retire deletes a generation once no clone leases it; with drain, a leased one is
// tombstoned now and goes with its last lease (pending is then true).
func (c *Client) Retire(ctx context.Context, template, gen string, drain bool) (pending bool, err error) {
	q := url.Values{}
	if drain {
		q.Set("drain", "true")
	}
	status, err := c.call(ctx, request{method: http.MethodDelete, path: templatePath(template, "generations", gen), query: q}, nil)
	return status == http.StatusAccepted, err
}

// Leases lists the clones that lease a generation.
func (c *Client) Leases(ctx context.Context, template, gen string) ([]Lease, error) {
	var list struct {
		Items []Lease `json:"items"`
	}
	if err := c.get(ctx, templatePath(template, "generations", gen, "leases"), nil, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}
