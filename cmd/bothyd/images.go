package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/store/image/registry"
)

// openImages opens the image store with a registry client configured by the flags, and
// cleans what a pull or import that died with an earlier server left (half-unpacked layers,
// spools, work locks nobody holds): a crash mid-pull must not need an operator.
func openImages(ctx context.Context, o *options, log *slog.Logger) (*image.Store, error) {
	reg, err := registry.New(registry.Options{AuthFile: o.registryAuth, Insecure: o.insecureRegistries, Mirror: o.registryMirror})
	if err != nil {
		return nil, fmt.Errorf("--registry-auth or --registry-mirror: %w", err)
	}
	images, err := image.Open(o.root, image.Options{Fetcher: reg})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	probs, err := images.Check(cctx, true)
	if err != nil {
		log.Warn("checking the image store", "err", err)
	}
	for _, p := range probs {
		if p.Repaired {
			log.Info("image store repaired", "problem", p.String())
		} else {
			log.Warn("image store problem; run bothyd check", "problem", p.String())
		}
	}
	return images, nil
}
