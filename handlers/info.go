package handlers

import (
	"context"

	"github.com/sandboxd/sandboxd/openapi"
	"github.com/sandboxd/sandboxd/supervisor"
)

func (h *Handlers) GetInfo(context.Context, openapi.GetInfoRequestObject) (openapi.GetInfoResponseObject, error) {
	var info openapi.Info
	info.Version = h.cfg.Version
	rt := h.sup.RuntimeInfo()
	info.Runtime.Kind = openapi.InfoRuntimeKind(rt.Kind)
	info.Runtime.Identity = rt.Identity
	images, err := h.sup.Images()
	if err != nil {
		return nil, err
	}
	for _, name := range images {
		desc := "A root filesystem directory under the state root's images/."
		if name == supervisor.HostImage {
			desc = "The host's /usr, read-only, with a generated /etc."
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
	h.portInfo(&info)
	return openapi.GetInfo200JSONResponse(info), nil
}
