package handlers

import (
	"context"

	"time"

	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

func (h *Handlers) GetInfo(context.Context, openapi.GetInfoRequestObject) (openapi.GetInfoResponseObject, error) {
	var info openapi.Info
	info.Version = h.cfg.Version
	rt := h.sup.RuntimeInfo()
	info.Runtime.Kind = openapi.InfoRuntimeKind(rt.Kind)
	info.Runtime.Identity = rt.Identity
	info.Runtimes = apiRuntimes(rt.Runtimes)
	images, err := h.imageNames()
	if err != nil {
		return nil, err
	}
	for _, img := range images {
		name := img.Name
		desc := "A root filesystem directory under the state root's images/."
		switch {
		case name == supervisor.HostImage:
			desc = "The host's /usr, read-only, with a generated /etc."
		case img.Kind == supervisor.ImageKindOCI:
			desc = "An OCI image, pulled or imported (see /v1/images/" + name + ")."
		}
		info.Images = append(info.Images, struct {
			Description *string `json:"description,omitempty"`
			Name        string  `json:"name"`
		}{Description: &desc, Name: name})
	}
	info.Limits.DefaultResources = apiResources(h.cfg.DefaultResources, h.cfg.DefaultDiskMB)
	info.Limits.MaxResources = openapi.Resources{Vcpus: 64, MemoryMb: 65536, Pids: 32768, DiskMb: 1 << 20}
	info.Limits.MaxBodyBytes = h.cfg.MaxJSONBytes
	info.Limits.MaxFileBytes = h.cfg.MaxFileBytes
	info.Limits.MaxExecOutputBytes = supervisor.MaxExecOutput
	info.Limits.MaxGenerationAgeSeconds = int64(h.cfg.MaxGenerationAge.Seconds())
	b := h.Bounds()
	info.Limits.Bounds = openapi.Bounds{
		FileOpsPerSandbox: b.FileOpsPerSandbox, FileOps: b.FileOps,
		ExecsPerSandbox: b.ExecsPerSandbox, Execs: b.Execs, EventStreams: b.EventStreams,
		RlimitNofile: int64(min(b.NoFile, 1<<62)),
	}
	info.Storage = h.storageHealth()
	h.portInfo(&info)
	if h.cfg.HostFirewall != nil {
		fw := h.cfg.HostFirewall()
		info.Network = &struct {
			HostFirewall openapi.HostFirewall `json:"host_firewall"`
		}{openapi.HostFirewall{State: openapi.HostFirewallState(fw.State), Detail: fw.Detail}}
	}
	return openapi.GetInfo200JSONResponse(info), nil
}

// imageNames are the images /v1/info lists: every image a sandbox can be created on now
// (a pull in progress or failed is not one).
func (h *Handlers) imageNames() ([]*supervisor.ImageInfo, error) {
	if h.cfg.Images == nil {
		names, err := h.sup.Images()
		out := make([]*supervisor.ImageInfo, 0, len(names))
		for _, n := range names {
			out = append(out, &supervisor.ImageInfo{Name: n})
		}
		return out, err
	}
	all, err := h.cfg.Images.ListImages()
	out := all[:0]
	for _, i := range all {
		if i.State == supervisor.ImageReady {
			out = append(out, i)
		}
	}
	return out, err
}

// storageHealth is the state root's health, or ok since now when the handlers were given no
// tracker (tests).
func (h *Handlers) storageHealth() openapi.StorageHealth {
	st := supervisor.StorageStatus{State: supervisor.StorageOK, Since: time.Now().UTC()}
	if h.cfg.Storage != nil {
		st = h.cfg.Storage()
	}
	out := openapi.StorageHealth{State: openapi.StorageHealthState(st.State), Since: st.Since, Root: st.Root}
	if st.Path != "" {
		p := st.Path
		out.Path = &p
	}
	return out
}

// apiRuntimes is the contract's view of the server's runtimes.
func apiRuntimes(rs []supervisor.RuntimeStatus) []openapi.RuntimeStatus {
	out := make([]openapi.RuntimeStatus, 0, len(rs))
	for _, r := range rs {
		v := openapi.RuntimeStatus{Kind: openapi.RuntimeKind(r.Kind), Default: r.Default, State: openapi.RuntimeStatusState(r.State)}
		if r.Accelerator != "" {
			a := openapi.RuntimeStatusAccelerator(r.Accelerator)
			v.Accelerator = &a
		}
		if r.AccelMode != "" {
			m := openapi.RuntimeStatusAcceleratorMode(r.AccelMode)
			v.AcceleratorMode = &m
		}
		if r.Reason != "" {
			reason := r.Reason
			v.Reason = &reason
		}
		if r.Identity != "" {
			id := r.Identity
			v.Identity = &id
		}
		if m := r.Mechanisms; m != nil && m.OverlayLayers != "" {
			// A runtime without root probes nothing: it shows no mechanisms.
			v.Mechanisms = &openapi.KernelMechanisms{Kernel: m.Kernel, OverlayLayers: openapi.KernelMechanismsOverlayLayers(m.OverlayLayers),
				UserNamespaces: m.UserNamespaces, Forced: m.Forced}
			if m.TmpfsOwnership != "" {
				o := openapi.KernelMechanismsTmpfsOwnership(m.TmpfsOwnership)
				v.Mechanisms.TmpfsOwnership = &o
			}
		}
		out = append(out, v)
	}
	return out
}
