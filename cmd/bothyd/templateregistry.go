package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/store/template"
	"github.com/bothy/bothy/store/template/registry"
	"github.com/bothy/bothy/supervisor"
)

// openTemplateRegistry is the template registry --template-registry names, with the
// credentials of --registry-auth; nil (no interface value) when none is named.
func openTemplateRegistry(o *options, ts *template.Store) (supervisor.GenerationRegistry, error) {
	if o.templateRegistry == "" {
		return nil, nil
	}
	host, _, _ := strings.Cut(o.templateRegistry, "/")
	// The holder's name in the registry's marks: the cluster's node name when there is a
	// cluster (a pod's host name changes with the pod), the host's name otherwise; with the
	// store's path, so two bothyds on one host are two holders.
	holder := ""
	if o.cluster.enabled {
		holder = o.cluster.nodeName + ":" + ts.Path()
	}
	reg, err := registry.New(registry.Options{
		Repository: o.templateRegistry,
		AuthFile:   o.registryAuth,
		Insecure:   slices.Contains(o.insecureRegistries, host),
		Holder:     holder,
	}, ts)
	if err != nil {
		return nil, fmt.Errorf("--template-registry: %w", err)
	}
	return reg, nil
}

// tombstoneSyncInterval is how often a node applies the registry's tombstones to the
// generations it holds (and once at start-up): a HEAD per held generation, then a sweep of
// the registry (registry.Collect: a listing of its tags, and a request or two per mark or
// copy it removes).
const tombstoneSyncInterval = 5 * time.Minute

// pushAgainTimeout bounds a sweep's push of one generation the registry lacks, as a
// capture's push is bounded.
const pushAgainTimeout = 30 * time.Minute

// syncTombstones applies the template registry's tombstones at start-up and then every
// tombstoneSyncInterval until ctx ends, and after each sweeps the registry: this node's
// marks on generations it no longer holds go, and the copies of tombstoned generations no
// node marks are deleted. With no registry it returns at once.
func syncTombstones(ctx context.Context, sup *supervisor.Supervisor, generations supervisor.GenerationRegistry, log *slog.Logger) {
	if generations == nil {
		return
	}
	t := time.NewTicker(tombstoneSyncInterval)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := sup.SyncTombstones(sctx); err != nil && ctx.Err() == nil {
			log.Warn("applying the template registry's tombstones; trying again later", "err", err)
		}
		unpushed := collectRegistry(sctx, generations, log)
		cancel()
		// In the background: a large generation's push must not hold up the next
		// sweep's tombstones (a generation whose push is under way is not pushed twice).
		go pushAgain(ctx, sup, unpushed, log)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// collectRegistry sweeps the template registry (registry.Collect) and logs what it did. A
// registry that refuses DELETE, or is down, is logged and left: the sweep is tried again
// at the next interval, and no clone depends on it.
func collectRegistry(ctx context.Context, generations supervisor.GenerationRegistry, log *slog.Logger) []registry.Ref {
	reg, ok := generations.(*registry.Registry)
	if !ok {
		return nil
	}
	done, err := reg.Collect(ctx)
	for _, g := range done.Deleted {
		log.Info("deleted a tombstoned generation from the template registry: no node holds a copy", "generation", g)
	}
	if len(done.Released) > 0 || len(done.Held) > 0 {
		log.Info("swept this node's marks in the template registry", "released", done.Released, "marked", done.Held)
	}
	if err != nil && ctx.Err() == nil {
		log.Warn("sweeping the template registry; what is left there is tried again later", "err", err)
	}
	return done.Unpushed
}

// pushAgain pushes the generations held here that the registry has no tag of (a push
// that failed or was cut by a crash or a restart), one at a time, each within the bound of
// a capture's push: other nodes can clone them once they are there. One that fails is
// logged and tried again by the next sweep.
func pushAgain(ctx context.Context, sup *supervisor.Supervisor, unpushed []registry.Ref, log *slog.Logger) {
	for _, g := range unpushed {
		pctx, cancel := context.WithTimeout(ctx, pushAgainTimeout)
		err := sup.PushAgain(pctx, g.Template, g.Generation)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("pushing a generation the template registry lacks; the next sweep tries again", "template", g.Template, "generation", g.Generation, "err", err)
		}
	}
}

// pullNotifier tells the cluster node that a pull brought a generation here, so that its
// BothyNode lists it for placement at once (a capture, tombstone or retirement is a
// supervisor event the node follows already; a pull is not one).
type pullNotifier struct {
	supervisor.GenerationRegistry
	pulled func()
}

func (p pullNotifier) Pull(ctx context.Context, tmpl, gen string) error {
	err := p.GenerationRegistry.Pull(ctx, tmpl, gen)
	if err == nil {
		p.pulled()
	}
	return err
}

// notifyPulls wraps generations so that every successful pull calls pulled; nil stays nil
// (no registry), so the supervisor still sees none.
func notifyPulls(generations supervisor.GenerationRegistry, pulled func()) supervisor.GenerationRegistry {
	if generations == nil {
		return nil
	}
	return pullNotifier{GenerationRegistry: generations, pulled: pulled}
}

// heldGenerations are the generations a clone on this node may lease now (active and
// eligible), newest first, for the BothyNode's status and so for placement.
func heldGenerations(sup *supervisor.Supervisor) []v1alpha1.Generation {
	if sup == nil {
		return nil
	}
	tmpls, err := sup.ListTemplates()
	if err != nil {
		return nil // no template store: none
	}
	var held []supervisor.Generation
	for _, t := range tmpls {
		gens, err := sup.ListGenerations(t.Name)
		if err != nil {
			continue // deleted meanwhile
		}
		for _, g := range gens {
			if g.State == template.StateActive && g.Eligibility == template.Eligible {
				held = append(held, g)
			}
		}
	}
	slices.SortFunc(held, func(a, b supervisor.Generation) int { return b.CapturedAt.Compare(a.CapturedAt) })
	out := make([]v1alpha1.Generation, len(held))
	for i, g := range held {
		out[i] = v1alpha1.Generation{Template: g.Template, Generation: g.ID}
	}
	return out
}
