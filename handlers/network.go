package handlers

import (
	"context"
	"maps"
	"slices"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// networkSetter is the supervisor's live policy change ([supervisor.Supervisor.SetNetwork]);
// a supervisor without it cannot change a sandbox's network.
type networkSetter interface {
	SetNetwork(ctx context.Context, id string, p supervisor.NetworkPolicy) (*supervisor.Status, error)
}

var _ networkSetter = (*supervisor.Supervisor)(nil)

func (h *Handlers) SetSandboxNetwork(ctx context.Context, req openapi.SetSandboxNetworkRequestObject) (openapi.SetSandboxNetworkResponseObject, error) {
	ns, ok := h.sup.(networkSetter)
	if !ok {
		return nil, errcode.New(errcode.Unavailable, "This server cannot change a sandbox's network.")
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	p := policyOf(req.Body)
	if p == nil {
		p = &supervisor.NetworkPolicy{}
	}
	st, err := ns.SetNetwork(ctx, req.ID, *p)
	if err != nil {
		return nil, err
	}
	return openapi.SetSandboxNetwork200JSONResponse(apiSandbox(st)), nil
}

// policyOf is the supervisor's form of a policy the contract carries; nil stays nil (no
// network). The entries are validated by the supervisor (network.Parse), whose errors name
// the entry at fault.
func policyOf(p *openapi.NetworkPolicy) *supervisor.NetworkPolicy {
	if p == nil {
		return nil
	}
	out := &supervisor.NetworkPolicy{Internet: p.Internet != nil && *p.Internet}
	if p.Allow != nil {
		out.Allow = *p.Allow
	}
	if p.Deny != nil {
		out.Deny = *p.Deny
	}
	if p.Secrets != nil {
		// The contract's map, by name, is the record's list, sorted by name.
		for _, name := range slices.Sorted(maps.Keys(*p.Secrets)) {
			b := (*p.Secrets)[name]
			sb := supervisor.SecretBinding{Secret: name, Hosts: b.Hosts}
			if b.Header != nil {
				sb.Header = &supervisor.SecretHeader{Name: b.Header.Name, Value: b.Header.Value}
			}
			out.Secrets = append(out.Secrets, sb)
		}
	}
	return out
}

// apiNetwork shows a sandbox's policy and address on sb.
func apiNetwork(sb *openapi.Sandbox, n *supervisor.NetworkStatus) {
	if n == nil {
		return
	}
	internet := n.Policy.Internet
	p := &openapi.NetworkPolicy{Internet: &internet}
	if len(n.Policy.Allow) > 0 {
		allow := n.Policy.Allow
		p.Allow = &allow
	}
	if len(n.Policy.Deny) > 0 {
		deny := n.Policy.Deny
		p.Deny = &deny
	}
	if len(n.Policy.Secrets) > 0 {
		secrets := make(openapi.SecretBindings, len(n.Policy.Secrets))
		for _, b := range n.Policy.Secrets {
			ob := openapi.SecretBinding{Hosts: b.Hosts}
			if b.Header != nil {
				ob.Header = &openapi.SecretHeader{Name: b.Header.Name, Value: b.Header.Value}
			}
			secrets[b.Secret] = ob
		}
		p.Secrets = &secrets
	}
	sb.Network = p
	if n.Address.IsValid() {
		a := n.Address.String()
		sb.Address = &a
	}
}
