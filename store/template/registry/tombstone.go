package registry

import (
	"context"
	"encoding/json"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/template"
)

// TombstoneArtifactType is the artifact type of a generation's tombstone in the registry:
// the generation was tombstoned or retired on some node, so every node is to do the same.
const TombstoneArtifactType = "application/vnd.bothy.template.tombstone.v1"

// AnnotationRetire is "true" on the tombstone of a retired generation (each node retires
// its copy when its last clone is gone), "false" on one that is only quarantined.
const AnnotationRetire = "dev.bothy.retire"

// TombstoneTag is the tag of a generation's tombstone.
func TombstoneTag(tmpl, gen string) string { return Tag(tmpl, gen) + ".tombstone" }

// tombstoneConfig is a tombstone's configuration blob.
type tombstoneConfig struct {
	Format     int       `json:"format"`
	Template   string    `json:"template"`
	Generation string    `json:"generation"`
	Retire     bool      `json:"retire"`
	At         time.Time `json:"at"`
}

// Tombstone pushes the tombstone of a generation: the tag TombstoneTag naming a manifest of
// TombstoneArtifactType. Once it is there no node pulls the generation, and each node that
// holds a copy tombstones or retires it at its next [Registry.Tombstoned] sweep. A retirement
// replaces a quarantine's tombstone; a quarantine never replaces a retirement's.
func (r *Registry) Tombstone(ctx context.Context, tmpl, gen string, retire bool) error {
	if err := template.ValidateName(tmpl); err != nil {
		return err
	}
	if err := template.ValidateGeneration(gen); err != nil {
		return err
	}
	if !retire {
		if found, retired, err := r.Tombstoned(ctx, tmpl, gen); err != nil || (found && retired) {
			return err
		}
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.opts...)
	cfg, err := json.Marshal(tombstoneConfig{Format: configFormat, Template: tmpl, Generation: gen, Retire: retire, At: time.Now().UTC()})
	if err != nil {
		return err
	}
	flag := "false"
	if retire {
		flag = "true"
	}
	m := manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: TombstoneArtifactType,
		Config: descriptorOf(cfg, ConfigMediaType),
		Layers: []v1.Descriptor{descriptorOf(cfg, ConfigMediaType)},
		Annotations: map[string]string{
			AnnotationTemplate: tmpl, AnnotationGeneration: gen, AnnotationRetire: flag,
		},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := remote.WriteLayer(r.repo, &blobLayer{data: cfg, mt: ConfigMediaType}, opts...); err != nil {
		return unavailable(err)
	}
	if err := remote.Put(r.repo.Tag(TombstoneTag(tmpl, gen)), rawManifest(raw), opts...); err != nil {
		return unavailable(err)
	}
	return nil
}

// Tombstoned says whether the registry holds a tombstone of the generation, and whether it
// is a retirement's. Only the manifest is read (bounded), never a blob.
func (r *Registry) Tombstoned(ctx context.Context, tmpl, gen string) (found, retire bool, err error) {
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.opts...)
	ref := r.repo.Tag(TombstoneTag(tmpl, gen))
	head, err := remote.Head(ref, opts...)
	if err != nil {
		if notFound(err) {
			return false, false, nil
		}
		return false, false, unavailable(err)
	}
	if head.Size <= 0 || head.Size > MaxConfigBytes {
		return false, false, hostile("the tombstone of %s declares %d bytes", Tag(tmpl, gen), head.Size)
	}
	desc, err := remote.Get(r.repo.Digest(head.Digest.String()), opts...)
	if err != nil {
		return false, false, unavailable(err)
	}
	var m manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || m.ArtifactType != TombstoneArtifactType ||
		m.Annotations[AnnotationTemplate] != tmpl || m.Annotations[AnnotationGeneration] != gen {
		return false, false, hostile("%s is not a tombstone of %s/%s", TombstoneTag(tmpl, gen), tmpl, gen)
	}
	return true, m.Annotations[AnnotationRetire] == "true", nil
}

// tombstonedError is a pull's refusal of a generation the cluster tombstoned or retired.
func tombstonedError(tmpl, gen string) error {
	return errcode.New(errcode.TemplateTombstoned, "Generation %s of template %s was tombstoned or retired in the cluster (the template registry holds its tombstone); clone another generation.", gen, tmpl)
}

func descriptorOf(data []byte, mt types.MediaType) v1.Descriptor {
	return v1.Descriptor{MediaType: mt, Size: int64(len(data)), Digest: digestOf(data)}
}

// FlushTombstones pushes the tombstones and retirements of the store's outbox
// ([template.Store.RecordRemoteTombstone]) and removes each record once the registry holds
// it. A record whose generation is still active in the store announces a change that was
// never made, and is removed unpushed. A record whose generation busy (if not nil) says
// is being changed now (its change not yet made) is left for a later call. It goes on past
// a record that fails and returns the first error with the records it pushed; what failed
// stays for the next call.
func (r *Registry) FlushTombstones(ctx context.Context, busy func(tmpl, gen string) bool) ([]template.RemoteTombstone, error) {
	recs, err := r.store.RemoteTombstones()
	if err != nil {
		return nil, err
	}
	var pushed []template.RemoteTombstone
	var first error
	for _, rec := range recs {
		if busy != nil && busy(rec.Template, rec.Generation) {
			continue
		}
		due, err := r.store.RemoteTombstoneDue(rec)
		if err == nil && due {
			err = r.Tombstone(ctx, rec.Template, rec.Generation, rec.Retire)
		}
		if err == nil {
			err = r.store.RemoteTombstoneDone(ctx, rec.Template, rec.Generation, rec.Retire)
		}
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		if due {
			pushed = append(pushed, rec)
		}
	}
	return pushed, first
}
