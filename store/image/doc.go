// Package image is the image store: OCI images, pulled from a registry or imported from an
// archive, kept as content-addressed layers that overlays stack, with one record per local
// image name. It is host-side and speaks no network protocol: a pull gets its image through
// a [Fetcher] (store/image/registry is the distribution-protocol one). It must not know
// sandboxes or templates: which of them use an image is its callers' business, as is
// mounting the layers.
//
// # Layout
//
// Everything lives in <state root>/images/.oci, a name that the supervisor's listing of
// images/ skips (image directories start with a letter or digit), beside the root filesystem
// directories an operator puts under images/ and the runtime's images/.host:
//
//	images/.oci/images.lock                  the store's lock (flock)
//	images/.oci/layers/sha256/<hex>/          one layer, named by its diff id
//	images/.oci/layers/sha256/<hex>/layer.json   its record (format 1)
//	images/.oci/layers/sha256/<hex>/fs/       its files: an overlay lower directory
//	images/.oci/refs/<name>.json              an image record (format 1): [Image]
//	images/.oci/work/<key>.lock               held by each live pull or import
//	images/.oci/staging/<key>/                an import's spooled archive members
//
// A layer is named by its diff id (the digest of its uncompressed tar stream), not by the
// digest of its blob: the same files compressed two ways (gzip from a registry, plain from
// docker save) are one layer on disk, and images that share a base share its files.
//
// # Invariants
//
//   - A layer directory under its final name is whole: it was unpacked under a temporary
//     name (".<hex>.<random>.tmp", flocked by its unpacker), both digests were checked, the
//     file system was flushed (syncfs), its record written and fsynced, and only then was it
//     renamed (RENAME_NOREPLACE) and the parent fsynced. A crash leaves a temporary name.
//   - An image record names only whole layers: it is written under the store's lock after
//     checking them, by a pull or import that holds a work lock.
//   - Check with repair removes layers (half-unpacked or unreferenced) only while no work
//     lock is held. Work locks are taken under the store's lock, which Check holds
//     throughout, so a pull or import either is seen by Check or starts after it.
//   - Deleting an image removes, under the same rule, the layers no other record names:
//     each is locked and renamed to a temporary name under the store's lock, and its files
//     removed after (collect.go). An unreferenced whole layer is therefore one a live or
//     failed pull or import left, or one of an image deleted while such work ran: not an
//     inconsistency, and bothyd check only notes it.
//
// # Unpacking is safe against hostile layers
//
// A layer's tar is treated as written by an attacker. Every entry is created with *at system
// calls relative to a descriptor of the layer's fs directory; the parent of each entry is
// opened with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV), so no path is
// ever joined into a host path and no link is ever followed. Refused, with [ErrUnsafeEntry]:
// names with a ".." element, absolute names, NUL bytes; any entry whose path passes through a
// symbolic link (a link that leads out, then a file written through it); hard links whose
// target is not an earlier non-directory entry of the same layer (outside, through a link, or
// not yet seen); whiteouts of "", "." and ".."; the ".wh..wh." names the format reserves;
// tar types other than files, directories, links, devices and FIFOs. Neutralised:
//
//   - Device nodes are skipped, except a character device 0/0, which is an overlay whiteout
//     and means what ".wh.<name>" means. No image needs a device: each sandbox gets its own
//     /dev, and the overlay is mounted nodev anyway.
//   - Setuid and setgid are dropped from every non-directory (directories keep setgid,
//     which only makes new entries inherit the group). The sandbox's overlay root is mounted
//     nosuid (runtime/namespace/shim), so the bits would grant nothing inside; outside, on
//     the host, a setuid-root file in a layer would be a way up for anyone who could reach
//     it. Dropping them costs nothing that works.
//   - Extended attributes in the tar (PAX SCHILY.xattr) are ignored: trusted.overlay.* ones
//     would steer the overlay, and file capabilities are inert under nosuid as setuid is.
//   - Symbolic link targets are kept as written, absolute or with "..": they are resolved
//     only inside a sandbox, whose root is the image.
//
// OCI whiteouts become overlay whiteouts: ".wh.<name>" a character device 0/0 named <name>
// (unless this layer has <name> itself: a whiteout hides only lower layers), and
// ".wh..wh..opq" the xattr trusted.overlay.opaque=y on its directory. Owners are the tar's
// uid and gid as they are; bothyd runs as root and sandboxes share the host's user ids
// today (mapping them for a user namespace is a pending issue, and would shift them here or
// at mount time). Each layer is bounded ([Limits]: bytes, compressed and not, and entries);
// an import is bounded in bytes and members; beyond a bound is [ErrTooLarge].
//
// # Imports and pulls
//
// [Store.Import] reads a docker save archive or an OCI image layout tarball as a stream,
// spooling its members because either format may put its manifest last; blobs are checked
// against their names, the manifest's descriptors and the configuration's diff ids
// ([ErrDigestMismatch]). [Store.Pull] asks the [Fetcher]; two pulls of one ref share one
// download in a process, and in two processes the second waits for the first's work lock and
// then finds the layers present. Progress is reported per layer, in bytes done of total.
package image
