package supervisor

import "context"

// CreateRequest is a new sandbox: provisioned from an image, or cloned from a template
// generation when Clone is set.
type CreateRequest struct {
	ID string
	// Image is the image to provision from; "" means HostImage. A clone takes its
	// generation's (see CloneRequest.Image).
	Image string
	// Resources are the sandbox's limits. A clone takes its generation's (see
	// CloneRequest.Resources).
	Resources Resources
	// DiskMB is the size of the sandbox's own disk; 0 means none. A clone's disk is its own.
	DiskMB int
	Env    map[string]string
	Labels map[string]string
	// Network is the egress policy; nil means no interface but lo.
	Network *NetworkPolicy
	// Clone, when set, names the generation to clone from.
	Clone *CloneRequest
}

// Create provisions a sandbox, or clones one (see [Supervisor.Provision] and
// [Supervisor.Clone]). The sandbox is not started.
func (s *Supervisor) Create(ctx context.Context, req CreateRequest) (*Status, error) {
	cfg := Config{
		ID:        req.ID,
		Image:     req.Image,
		Resources: req.Resources,
		DiskMB:    req.DiskMB,
		Env:       req.Env,
		Labels:    req.Labels,
		Network:   req.Network,
	}
	if err := s.checkNetwork(req.Network); err != nil {
		return nil, err
	}
	if req.Clone != nil {
		return s.Clone(ctx, cfg, *req.Clone)
	}
	return s.Provision(ctx, cfg)
}
