package handlers

import (
	"context"
	"io"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/supervisor"
)

// Images is what the image operations need of the supervisor ([supervisor.Supervisor]). It is
// apart from [Supervisor] so that a server without an image store (Config.Images nil)
// answers them not-implemented.
type Images interface {
	ListImages() ([]*supervisor.ImageInfo, error)
	Image(name string) (*supervisor.ImageInfo, error)
	PullImage(ctx context.Context, req supervisor.PullRequest) (*supervisor.ImageInfo, error)
	ImportImage(ctx context.Context, name string, r io.Reader) (*supervisor.ImageInfo, error)
	DeleteImage(ctx context.Context, name string) error
}

var _ Images = (*supervisor.Supervisor)(nil)

func (h *Handlers) images() (Images, error) {
	if h.cfg.Images == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server has no image store configured.")
	}
	return h.cfg.Images, nil
}

// ListImages lists the images a page at a time by name, so that a page's last name is the
// next page's cursor, as in every other list.
func (h *Handlers) ListImages(_ context.Context, req openapi.ListImagesRequestObject) (openapi.ListImagesResponseObject, error) {
	var infos []*supervisor.ImageInfo
	var err error
	if im, ierr := h.images(); ierr == nil {
		infos, err = im.ListImages()
	} else {
		// Without an image store the built-in and directory images are still listed.
		var names []string
		names, err = h.sup.Images()
		for _, n := range names {
			kind := supervisor.ImageKindDirectory
			if n == supervisor.HostImage {
				kind = supervisor.ImageKindHost
			}
			infos = append(infos, &supervisor.ImageInfo{Name: n, Kind: kind, State: supervisor.ImageReady})
		}
	}
	if err != nil {
		return nil, err
	}
	page, next, err := paginateKeys(infos, req.Params.Cursor, req.Params.Limit, func(i *supervisor.ImageInfo) string { return i.Name }, image.NameShape) // the contract's ImageCursor
	if err != nil {
		return nil, err
	}
	out := openapi.ListImages200JSONResponse{Items: []openapi.Image{}, NextCursor: next}
	for _, i := range page {
		out.Items = append(out.Items, apiImage(i))
	}
	return out, nil
}

func (h *Handlers) PullImage(ctx context.Context, req openapi.PullImageRequestObject) (openapi.PullImageResponseObject, error) {
	im, err := h.images()
	if err != nil {
		return nil, err
	}
	pr := supervisor.PullRequest{Ref: req.Body.Ref, Name: deref(req.Body.Name), Platform: deref(req.Body.Platform)}
	info, err := im.PullImage(ctx, pr)
	if err != nil {
		return nil, err
	}
	loc := "/v1/images/" + info.Name
	return openapi.PullImage202JSONResponse{Body: apiImage(info), Headers: openapi.PullImage202ResponseHeaders{Location: &loc}}, nil
}

func (h *Handlers) GetImage(_ context.Context, req openapi.GetImageRequestObject) (openapi.GetImageResponseObject, error) {
	var info *supervisor.ImageInfo
	if im, err := h.images(); err == nil {
		if info, err = im.Image(req.Name); err != nil {
			return nil, err
		}
	} else {
		names, err := h.sup.Images()
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if n == req.Name {
				kind := supervisor.ImageKindDirectory
				if n == supervisor.HostImage {
					kind = supervisor.ImageKindHost
				}
				info = &supervisor.ImageInfo{Name: n, Kind: kind, State: supervisor.ImageReady}
			}
		}
		if info == nil {
			return nil, errcode.New(errcode.ImageNotFound, "There is no image %q.", req.Name)
		}
	}
	return openapi.GetImage200JSONResponse(apiImage(info)), nil
}

func (h *Handlers) ImportImage(ctx context.Context, req openapi.ImportImageRequestObject) (openapi.ImportImageResponseObject, error) {
	im, err := h.images()
	if err != nil {
		return nil, err
	}
	info, err := im.ImportImage(ctx, req.Name, req.Body)
	if err != nil {
		return nil, err
	}
	return openapi.ImportImage201JSONResponse(apiImage(info)), nil
}

func (h *Handlers) DeleteImage(ctx context.Context, req openapi.DeleteImageRequestObject) (openapi.DeleteImageResponseObject, error) {
	im, err := h.images()
	if err != nil {
		return nil, err
	}
	ctx, cancel := deadline(ctx, nil, defaultTimeout)
	defer cancel()
	if err := im.DeleteImage(ctx, req.Name); err != nil {
		return nil, err
	}
	return openapi.DeleteImage204Response{}, nil
}

func apiImage(i *supervisor.ImageInfo) openapi.Image {
	out := openapi.Image{Name: i.Name, Kind: openapi.ImageKind(i.Kind), State: openapi.ImageState(i.State)}
	if i.Kind != supervisor.ImageKindOCI {
		return out
	}
	out.Ref = ptrIf(i.Ref)
	out.Digest = ptrIf(i.Digest)
	out.ConfigDigest = ptrIf(i.ConfigDigest)
	out.Platform = ptrIf(i.Platform)
	out.Error = ptrIf(i.Error)
	if !i.Created.IsZero() {
		c := i.Created
		out.CreatedAt = &c
	}
	if i.State == supervisor.ImageReady {
		size := i.Size
		out.SizeBytes = &size
		c := i.Config
		out.Config = &openapi.ImageConfig{Env: sliceIf(c.Env), WorkingDir: ptrIf(c.WorkingDir), User: ptrIf(c.User),
			Entrypoint: sliceIf(c.Entrypoint), Cmd: sliceIf(c.Cmd)}
		used := append([]string{}, i.UsedBy...)
		out.UsedBy = &used
	}
	layers := []openapi.ImageLayer{}
	for _, l := range i.Layers {
		al := openapi.ImageLayer{DiffID: l.DiffID}
		if i.State != supervisor.ImageReady {
			done, total, present := l.Done, l.Total, l.Present
			al.BytesDone, al.BytesTotal, al.Present = &done, &total, &present
		}
		layers = append(layers, al)
	}
	out.Layers = &layers
	return out
}

func ptrIf(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func sliceIf(s []string) *[]string {
	if len(s) == 0 {
		return nil
	}
	return &s
}
