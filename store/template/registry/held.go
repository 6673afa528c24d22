package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/template"
)

// HeldArtifactType is the artifact type of a holder's mark in the registry: the node (the
// template store) the mark names holds a copy of the generation, or is bringing one here.
// The registry's copy of a tombstoned generation is deleted only once no mark is left.
const HeldArtifactType = "application/vnd.bothy.template.held.v1"

// AnnotationHolder names the holder of a mark (Options.Holder), for an operator to read.
const AnnotationHolder = "dev.bothy.holder"

// heldInfix separates a generation's tag from the holder's id in a mark's tag.
const heldInfix = ".held-"

// HeldTag is the tag of the mark of holder id (HolderID) on a generation.
func HeldTag(tmpl, gen, id string) string { return Tag(tmpl, gen) + heldInfix + id }

// HolderID is the id of a holder in the tags of its marks: 16 hex digits of the SHA-256 of
// its name, so that any name (a host name and a path) makes a valid tag of fixed length.
func HolderID(holder string) string {
	sum := sha256.Sum256([]byte(holder))
	return hex.EncodeToString(sum[:8])
}

// heldConfig is a mark's configuration blob. It has no time, so a mark put again is the
// same manifest; it names its holder, so the marks of two holders are two manifests, and
// the deletion of one by digest never takes the other's tag with it.
type heldConfig struct {
	Format     int    `json:"format"`
	Template   string `json:"template"`
	Generation string `json:"generation"`
	Holder     string `json:"holder"`
}

// hold puts this holder's mark on a generation, before a pull reads the tombstone and
// before a push tags the generation: so a node that deletes the generation's copy after it
// saw the tombstone sees the mark of every node that may hold a copy.
func (r *Registry) hold(ctx context.Context, tmpl, gen string) error {
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.opts...)
	cfg, err := json.Marshal(heldConfig{Format: configFormat, Template: tmpl, Generation: gen, Holder: r.holder})
	if err != nil {
		return err
	}
	m := manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: HeldArtifactType,
		Config: descriptorOf(cfg, ConfigMediaType),
		Layers: []v1.Descriptor{descriptorOf(cfg, ConfigMediaType)},
		Annotations: map[string]string{
			AnnotationTemplate: tmpl, AnnotationGeneration: gen, AnnotationHolder: r.holder,
		},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := remote.WriteLayer(r.repo, &blobLayer{data: cfg, mt: ConfigMediaType}, opts...); err != nil {
		return unavailable(err)
	}
	if err := remote.Put(r.repo.Tag(HeldTag(tmpl, gen, r.holderID)), rawManifest(raw), opts...); err != nil {
		return unavailable(err)
	}
	return nil
}

// holds says whether the template store holds generation gen of tmpl (in any state); an
// error other than not-found counts as held, so that a mark is never dropped in doubt.
func (r *Registry) holds(tmpl, gen string) bool {
	now, err := r.store.Now()
	if err != nil {
		return true
	}
	_, err = r.store.Generation(tmpl, gen, now)
	switch errcode.Of(err) {
	case errcode.TemplateNotFound, errcode.GenerationNotFound:
		return false
	}
	return true
}

// dropHold removes this holder's mark on a generation the store does not hold, unless a
// pull of it is in flight in this process (inFlight: the caller is that pull). It says
// whether it removed (or found no) mark. holdMu orders it with hold: a pull registers its
// flight before it puts its mark, so a mark is never removed under a pull.
func (r *Registry) dropHold(ctx context.Context, tmpl, gen string, inFlight bool) (bool, error) {
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	if !inFlight {
		r.mu.Lock()
		_, busy := r.flights[Tag(tmpl, gen)]
		r.mu.Unlock()
		if busy {
			return false, nil
		}
	}
	if r.holds(tmpl, gen) {
		return false, nil
	}
	return true, r.deleteTag(ctx, HeldTag(tmpl, gen, r.holderID))
}

// Release is called once this node's copy of a generation is gone (retired here) and once
// its tombstone is recorded: it removes this holder's mark, unless the store holds the
// generation or a pull of it is in flight, and then deletes the registry's copy of the
// generation if it is tombstoned and no holder's mark is left ([Registry.Collect] does the
// same for every generation, as a sweep).
func (r *Registry) Release(ctx context.Context, tmpl, gen string) error {
	if err := template.ValidateName(tmpl); err != nil {
		return err
	}
	if err := template.ValidateGeneration(gen); err != nil {
		return err
	}
	if _, err := r.dropHold(ctx, tmpl, gen, false); err != nil {
		return err
	}
	_, err := r.collect(ctx, tmpl, gen)
	return err
}

// collect deletes the registry's copy of a generation whose tombstone it holds once no
// holder's mark is left, and says whether it deleted it. The order makes it sound against
// a pull on another node: the tombstone is confirmed first, the marks are listed after it
// (a pull puts its mark before it reads the tombstone, so a pull that missed the tombstone
// put a mark this listing sees), and only then is the copy deleted. The tombstone's tag
// stays, so a later pull is still refused as tombstoned.
func (r *Registry) collect(ctx context.Context, tmpl, gen string) (bool, error) {
	found, _, err := r.Tombstoned(ctx, tmpl, gen)
	if err != nil || !found {
		return false, err
	}
	tags, err := r.tags(ctx)
	if err != nil {
		return false, err
	}
	g := groupTags(tags)[Tag(tmpl, gen)]
	if g == nil || !g.pushed || len(g.held) > 0 {
		return false, nil
	}
	if err := r.deleteTag(ctx, Tag(tmpl, gen)); err != nil {
		return false, err
	}
	return true, nil
}

// Collected is what a sweep of the registry did.
type Collected struct {
	Held     []string // generations ("<template>.<generation>") this holder marked again
	Released []string // generations whose mark of this holder it removed
	Deleted  []string // generations whose copy it deleted from the registry
	// Unpushed are the active generations the store holds of which the registry has no tag
	// at all (neither a copy nor a tombstone): a push that failed or was cut by a crash or
	// a restart, a capture made before the registry was configured. The caller pushes
	// them (Collect itself writes no copy).
	Unpushed []Ref
}

// Ref names a generation of a template.
type Ref struct{ Template, Generation string }

// Collect sweeps the registry for this holder: it removes its marks on generations the
// store does not hold (a pull that failed or was cut by a crash, a copy retired while the
// registry was down), marks again those the store holds and the registry has a copy of
// without its mark (a pull made before marks existed, a mark lost), deletes the copy of
// every tombstoned generation no holder marks (see collect), and lists the store's active
// generations the registry has no tag of (Collected.Unpushed). Every step is idempotent, so a
// sweep cut short is finished by the next. Errors are joined: one generation's failure (a
// registry that refuses DELETE) does not stop the others.
func (r *Registry) Collect(ctx context.Context) (Collected, error) {
	var out Collected
	tags, err := r.tags(ctx)
	if err != nil {
		return out, err
	}
	groups := groupTags(tags)
	var errs []error
	for key, g := range groups {
		if !g.held[r.holderID] {
			continue
		}
		dropped, err := r.dropHold(ctx, g.tmpl, g.gen, false)
		if err != nil {
			errs = append(errs, err)
		} else if dropped {
			delete(g.held, r.holderID)
			out.Released = append(out.Released, key)
		}
	}
	if now, err := r.store.Now(); err == nil {
		if tmpls, err := r.store.Templates(now); err == nil {
			for _, t := range tmpls {
				gens, err := r.store.Generations(t.Name, now)
				if err != nil {
					continue // deleted meanwhile
				}
				for _, sg := range gens {
					g := groups[Tag(t.Name, sg.ID)]
					if g == nil && sg.State == template.StateActive {
						out.Unpushed = append(out.Unpushed, Ref{Template: t.Name, Generation: sg.ID})
						continue
					}
					if g == nil || !g.pushed || g.held[r.holderID] {
						continue
					}
					if err := r.hold(ctx, t.Name, sg.ID); err != nil {
						errs = append(errs, err)
					} else {
						out.Held = append(out.Held, Tag(t.Name, sg.ID))
					}
				}
			}
		}
	}
	for key, g := range groups {
		if !g.pushed || !g.tombstoned || len(g.held) > 0 {
			continue
		}
		deleted, err := r.collect(ctx, g.tmpl, g.gen)
		if err != nil {
			errs = append(errs, err)
		} else if deleted {
			out.Deleted = append(out.Deleted, key)
		}
	}
	return out, errors.Join(errs...)
}

// genTags are the tags of one generation in the repository.
type genTags struct {
	tmpl, gen  string
	pushed     bool            // <template>.<generation>
	tombstoned bool            // <template>.<generation>.tombstone
	held       map[string]bool // <template>.<generation>.held-<id>, by holder id
}

// groupTags sorts a repository's tags by generation; tags that are not bothy's are left out.
func groupTags(tags []string) map[string]*genTags {
	out := map[string]*genTags{}
	for _, tag := range tags {
		parts := strings.SplitN(tag, ".", 3)
		if len(parts) < 2 || template.ValidateName(parts[0]) != nil || template.ValidateGeneration(parts[1]) != nil {
			continue
		}
		key := Tag(parts[0], parts[1])
		g := out[key]
		if g == nil {
			g = &genTags{tmpl: parts[0], gen: parts[1], held: map[string]bool{}}
			out[key] = g
		}
		switch {
		case len(parts) == 2:
			g.pushed = true
		case parts[2] == "tombstone":
			g.tombstoned = true
		case strings.HasPrefix("."+parts[2], heldInfix):
			g.held[strings.TrimPrefix("."+parts[2], heldInfix)] = true
		}
	}
	return out
}

// deleteTag deletes a tag and the manifest it names: the tag first (the OCI distribution
// spec's DELETE of a tag, which some registries refuse), then the manifest by its digest
// (which distribution's registry answers by deleting every tag that names it too). Every
// manifest bothy tags is one of its own (a generation's, a tombstone's, one holder's mark),
// so no other tag goes with it. A tag or manifest already gone is done. The blobs stay,
// for the registry's garbage collection to reclaim. A registry that refuses both DELETEs
// (deletion is often off by default: distribution's storage.delete.enabled) is
// registry-refused, and the tag stays.
func (r *Registry) deleteTag(ctx context.Context, tag string) error {
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.opts...)
	ref := r.repo.Tag(tag)
	head, err := remote.Head(ref, opts...)
	if err != nil {
		if notFound(err) {
			return nil
		}
		return unavailable(err)
	}
	tagErr := remote.Delete(ref, opts...)
	if tagErr != nil && !notFound(tagErr) && !refused(tagErr) {
		return unavailable(tagErr)
	}
	digestErr := remote.Delete(r.repo.Digest(head.Digest.String()), opts...)
	switch {
	case digestErr == nil, notFound(digestErr):
		return nil
	case refused(digestErr) && tagErr == nil:
		return nil // the tag is gone; the manifest is left for the registry's collection
	case refused(digestErr):
		return errcode.Wrap(errcode.RegistryRefused, digestErr, "The template registry refuses to delete %s (%v); turn deletion on in the registry (distribution: storage.delete.enabled), or delete it by hand.", tag, digestErr)
	}
	return unavailable(digestErr)
}

// refused says whether err is a registry's refusal of a request it does not support or
// allow, as opposed to one it could not answer.
func refused(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	switch te.StatusCode {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusMethodNotAllowed:
		return true
	}
	return false
}
