package handlers

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"

	"github.com/bothy/bothy/errcode"

	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// fileUser is the user file operations act as: the same default user as exec, so that
// files written through the API belong to the workloads that use them, and the sandbox's
// own permissions apply.
const fileUser = "user"

// maxListEntries bounds a directory listing.
const maxListEntries = 10000

func (h *Handlers) ReadFile(ctx context.Context, req openapi.ReadFileRequestObject) (openapi.ReadFileResponseObject, error) {
	release, err := h.bounds.admitFileOp(req.ID)
	if err != nil {
		return nil, err
	}
	// A read's slot is held until its body is sent (releasingReader); anything else ends here.
	defer func() { release() }()
	// The file's content belongs to the response, not to this call: the generated code
	// streams it to the client and closes it. Its length is that of the file the agent
	// opened, so a file renamed over meanwhile cannot make the two disagree.
	rc, size, err := h.sup.ReadFile(context.WithoutCancel(ctx), req.ID, req.Params.Path, fileUser)
	if err != nil {
		return nil, pathFault(err)
	}
	resp := openapi.ReadFile200ApplicationOctetStreamResponse{Body: &releasingReader{ReadCloser: rc, release: release}}
	release = func() {}
	if size > 0 {
		resp.ContentLength = size
	}
	return resp, nil
}

// ListFiles answers a directory's entries, at most maxListEntries of them.
func (h *Handlers) ListFiles(ctx context.Context, req openapi.ListFilesRequestObject) (openapi.ListFilesResponseObject, error) {
	release, err := h.bounds.admitFileOp(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	infos, err := h.sup.ListFiles(ctx, req.ID, req.Params.Path, fileUser)
	if err != nil {
		return nil, pathFault(err)
	}
	out := openapi.FileList{Items: make([]openapi.FileEntry, 0, min(len(infos), maxListEntries))}
	for i, fi := range infos {
		if i == maxListEntries {
			break
		}
		out.Items = append(out.Items, apiFileEntry(fi))
	}
	return openapi.ListFiles200JSONResponse(out), nil
}

func (h *Handlers) WriteFile(ctx context.Context, req openapi.WriteFileRequestObject) (openapi.WriteFileResponseObject, error) {
	parents := req.Params.Parents == nil || *req.Params.Parents
	w := supervisor.WriteRequest{Path: req.Params.Path, User: fileUser, Mode: 0o644, MakeParents: parents}
	release, err := h.bounds.admitFileOp(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if _, err := h.sup.WriteFile(ctx, req.ID, w, req.Body); err != nil {
		if !parents && errcode.Of(err) == errcode.FileNotFound {
			// The file itself is being created: what is missing is a directory above it.
			return nil, &errcode.Error{Code: errcode.FileNotFound, Field: "path", Err: err,
				Msg: fmt.Sprintf("The directory %q, where %q would go, does not exist; create it first, or write with parents=true.",
					truncate(path.Dir(req.Params.Path)), truncate(req.Params.Path))}
		}
		return nil, pathFault(err)
	}
	return openapi.WriteFile204Response{}, nil
}

func (h *Handlers) RemoveFile(ctx context.Context, req openapi.RemoveFileRequestObject) (openapi.RemoveFileResponseObject, error) {
	recursive := req.Params.Recursive != nil && *req.Params.Recursive
	release, err := h.bounds.admitFileOp(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := h.sup.RemoveFile(ctx, req.ID, req.Params.Path, fileUser, recursive); err != nil {
		return nil, pathFault(err)
	}
	return openapi.RemoveFile204Response{}, nil
}

func apiFileEntry(fi supervisor.FileInfo) openapi.FileEntry {
	t := openapi.FileEntryTypeOther
	switch fi.Type {
	case supervisor.FileRegular:
		t = openapi.FileEntryTypeFile
	case supervisor.FileDir:
		t = openapi.FileEntryTypeDirectory
	case supervisor.FileSymlink:
		t = openapi.FileEntryTypeSymlink
	}
	return openapi.FileEntry{
		Name:       fi.Name,
		Type:       t,
		Size:       fi.Size,
		Mode:       fmt.Sprintf("%04o", fi.Mode),
		ModifiedAt: fi.ModifiedAt,
	}
}

// pathFault names `path` as the field at fault of a file operation's refusal: an
// invalid-request, or a refusal of the sandbox's files (a directory read as a file, a
// non-empty directory removed without recursive=true, a component that is not a directory, a
// path the user may not access). The path is the one input such a refusal is about.
func pathFault(err error) error {
	return faultAt(err, "path", errcode.InvalidRequest)
}

// fileRefusals are the codes of the refusals a sandbox's files make (errcode's block of
// them), which name the field whose path was refused.
var fileRefusals = []errcode.Code{
	errcode.PermissionDenied, errcode.NotADirectory, errcode.IsADirectory,
	errcode.NotARegularFile, errcode.DirectoryNotEmpty, errcode.FileExists,
	errcode.SymlinkLoop, errcode.MountInside, errcode.FileChanged, errcode.NameTooLong,
}

// faultAt names field as the one at fault of err when err is a file refusal or has one of
// the codes also, and names no field yet.
func faultAt(err error, field string, also ...errcode.Code) error {
	var e *errcode.Error
	if !errors.As(err, &e) || e.Field != "" || !(slices.Contains(fileRefusals, e.Code) || slices.Contains(also, e.Code)) {
		return err
	}
	return &errcode.Error{Code: e.Code, Msg: e.Msg, Field: field, Err: err}
}

// truncate bounds a client's path quoted back in a message.
func truncate(path string) string {
	const max = 256
	if len(path) <= max {
		return path
	}
	return path[:max] + "..."
}
