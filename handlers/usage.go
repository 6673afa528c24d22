package handlers

import (
	"context"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/usage"
)

// GetSandboxMetrics answers a sandbox's usage now and the sampler's history of it.
func (h *Handlers) GetSandboxMetrics(_ context.Context, req openapi.GetSandboxMetricsRequestObject) (openapi.GetSandboxMetricsResponseObject, error) {
	if h.cfg.Usage == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server does not sample sandboxes' usage.")
	}
	cur, hist, err := h.cfg.Usage.Read(req.ID)
	if err != nil {
		return nil, err
	}
	out := openapi.GetSandboxMetrics200JSONResponse{
		ID: req.ID, IntervalMs: h.cfg.Usage.Interval().Milliseconds(),
		Current: APIUsage(cur), History: make([]openapi.UsageSample, 0, len(hist)),
	}
	for _, sm := range hist {
		out.History = append(out.History, APIUsage(sm))
	}
	return out, nil
}

// APIUsage is a sample in the API's form.
func APIUsage(sm usage.Sample) openapi.UsageSample {
	u := openapi.UsageSample{
		At: sm.At.UTC(), CPUSeconds: sm.CPU.Seconds(), MemoryBytes: sm.MemoryBytes, Pids: sm.Pids,
		Vcpus: &sm.VCPUs, MemoryLimitBytes: &sm.MemoryLimitBytes, PidsLimit: &sm.PidsLimit,
	}
	if sm.HasRate {
		u.CPURate = &sm.CPURate
	}
	if sm.CPUApproximate {
		u.CPUApproximate = &sm.CPUApproximate
	}
	if sm.HasMemoryPeak {
		u.MemoryPeakBytes = &sm.MemoryPeakBytes
	}
	if sm.HasDisk {
		u.DiskUsedBytes, u.DiskLimitBytes = &sm.DiskUsedBytes, &sm.DiskLimitBytes
	}
	if sm.HasNetwork {
		in, out := int64(sm.NetInBytes), int64(sm.NetOutBytes) //nolint:gosec // byte counts far below 2^63
		u.NetInBytes, u.NetOutBytes = &in, &out
	}
	return u
}
