package handlers

import (
	"context"
	"fmt"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/volume"
)

// volumes returns the volume store, or not-implemented on a server without one.
func (h *Handlers) volumes() (*volume.Store, error) {
	if h.cfg.Volumes == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server keeps no volumes.")
	}
	return h.cfg.Volumes, nil
}

func volumeOf(v *volume.Volume) openapi.Volume {
	out := openapi.Volume{Name: v.Name, SizeMb: v.SizeMB, UsedBytes: v.UsedBytes, CreatedAt: v.CreatedAt, Sandboxes: v.Holders}
	if out.Sandboxes == nil {
		out.Sandboxes = []string{}
	}
	return out
}

func volumeEntryOf(e *volume.Entry) openapi.VolumeFileEntry {
	out := openapi.VolumeFileEntry{
		Name: e.Name, Path: e.Path, Type: openapi.VolumeFileEntryType(e.Type), Size: e.Size,
		Mode: fmt.Sprintf("%04o", e.Mode), UID: int(e.UID), GID: int(e.GID), ModifiedAt: e.ModTime,
	}
	if e.Type == "symlink" {
		t := e.Target
		out.Target = &t
	}
	return out
}

func (h *Handlers) CreateVolume(ctx context.Context, req openapi.CreateVolumeRequestObject) (openapi.CreateVolumeResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	size := 0
	if req.Body.SizeMb != nil {
		size = *req.Body.SizeMb
	}
	v, err := vs.Create(context.WithoutCancel(ctx), req.Body.Name, size)
	if err != nil {
		return nil, err
	}
	return openapi.CreateVolume201JSONResponse(volumeOf(v)), nil
}

func (h *Handlers) ListVolumes(_ context.Context, req openapi.ListVolumesRequestObject) (openapi.ListVolumesResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	list, err := vs.List()
	if err != nil {
		return nil, err
	}
	page, next, err := paginate(list, req.Params.Cursor, req.Params.Limit, func(v *volume.Volume) string { return v.Name })
	if err != nil {
		return nil, err
	}
	out := openapi.ListVolumes200JSONResponse{Items: make([]openapi.Volume, 0, len(page)), NextCursor: next}
	for _, v := range page {
		out.Items = append(out.Items, volumeOf(v))
	}
	return out, nil
}

func (h *Handlers) GetVolume(_ context.Context, req openapi.GetVolumeRequestObject) (openapi.GetVolumeResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	v, err := vs.Get(req.Name)
	if err != nil {
		return nil, err
	}
	return openapi.GetVolume200JSONResponse(volumeOf(v)), nil
}

func (h *Handlers) DeleteVolume(_ context.Context, req openapi.DeleteVolumeRequestObject) (openapi.DeleteVolumeResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	if err := vs.Delete(req.Name); err != nil {
		return nil, err
	}
	return openapi.DeleteVolume204Response{}, nil
}

func (h *Handlers) ReadVolumeFile(_ context.Context, req openapi.ReadVolumeFileRequestObject) (openapi.ReadVolumeFileResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	release, err := h.bounds.admitVolumeFileOp(req.Name)
	if err != nil {
		return nil, err
	}
	// The file belongs to the response, which streams and closes it, and releases the slot.
	rc, size, err := vs.Open(req.Name, req.Params.Path)
	if err != nil {
		release()
		return nil, pathFault(err)
	}
	return openapi.ReadVolumeFile200ApplicationOctetStreamResponse{Body: &releasingReader{ReadCloser: rc, release: release}, ContentLength: size}, nil
}

func (h *Handlers) WriteVolumeFile(_ context.Context, req openapi.WriteVolumeFileRequestObject) (openapi.WriteVolumeFileResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	parents := req.Params.Parents == nil || *req.Params.Parents
	release, err := h.bounds.admitVolumeFileOp(req.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := vs.Write(req.Name, req.Params.Path, req.Body, volume.WriteOptions{Parents: parents})
	if err != nil {
		return nil, pathFault(err)
	}
	return openapi.WriteVolumeFile200JSONResponse(volumeEntryOf(e)), nil
}

func (h *Handlers) RemoveVolumeFile(_ context.Context, req openapi.RemoveVolumeFileRequestObject) (openapi.RemoveVolumeFileResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	recursive := req.Params.Recursive != nil && *req.Params.Recursive
	release, err := h.bounds.admitVolumeFileOp(req.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := vs.Remove(req.Name, req.Params.Path, recursive); err != nil {
		return nil, pathFault(err)
	}
	return openapi.RemoveVolumeFile204Response{}, nil
}

func (h *Handlers) ListVolumeFiles(_ context.Context, req openapi.ListVolumeFilesRequestObject) (openapi.ListVolumeFilesResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	release, err := h.bounds.admitVolumeFileOp(req.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	ents, err := vs.ListDir(req.Name, req.Params.Path)
	if err != nil {
		return nil, pathFault(err)
	}
	out := openapi.ListVolumeFiles200JSONResponse{Items: make([]openapi.VolumeFileEntry, 0, len(ents))}
	for i := range ents {
		out.Items = append(out.Items, volumeEntryOf(&ents[i]))
	}
	return out, nil
}

func (h *Handlers) MakeVolumeDir(_ context.Context, req openapi.MakeVolumeDirRequestObject) (openapi.MakeVolumeDirResponseObject, error) {
	vs, err := h.volumes()
	if err != nil {
		return nil, err
	}
	parents := req.Params.Parents == nil || *req.Params.Parents
	release, err := h.bounds.admitVolumeFileOp(req.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := vs.Mkdir(req.Name, req.Params.Path, volume.WriteOptions{Parents: parents})
	if err != nil {
		return nil, pathFault(err)
	}
	return openapi.MakeVolumeDir200JSONResponse(volumeEntryOf(e)), nil
}
