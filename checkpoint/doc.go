// Package checkpoint keeps the named checkpoints of one sandbox's files and rolls the
// sandbox back to them, without copying the files where it can (docs/checkpoints.md).
//
// A sandbox of the namespace runtime sees its files through an overlay: read-only lowers
// (its image, a template generation) under its writable upper directory <dir>/upper. This
// package adds a chain of frozen layers between the two, kept in <dir>/checkpoints:
//
//	checkpoints/manifest.json   the chain (top first), the checkpoints, an operation in flight
//	checkpoints/layers/<id>/    a frozen layer: a former upper, whiteouts and opaque dirs kept
//	checkpoints/.staging-<id>   a layer being copied (a running sandbox's checkpoint)
//	checkpoints/upper.next      the empty upper a rollback swaps in
//	checkpoints/trash-<rand>    what a rollback or a delete threw away, removed after it
//
// A checkpoint names a chain of layers. Taken of a stopped sandbox it rotates: the upper is
// renamed into a new layer on top of the chain and an empty upper replaces it, a rename
// whatever the size of the files. Taken of a running sandbox (whose upper is mounted and
// cannot be renamed away from under its processes) the upper is copied into a new layer
// while the sandbox is frozen: copy_file_range, so a reflink on a file system that has them
// (XFS, btrfs) and a copy of the bytes elsewhere (ext4). A rollback makes the checkpoint's
// chain the sandbox's and swaps in an empty upper: renames again. Layers no chain names are
// removed.
//
// A microVM's writable layer is one file instead, its disk overlay (Sandbox.File): a layer is
// then a directory holding that file, each backing onto the layer below by the path in its
// header; a rotation renames the file into a new layer, a copy copies it (the VM frozen with
// its disk flushed), and a rollback throws it away, the runtime making a new overlay over the
// checkpoint's top layer at the next launch. Such a chain is not flattened.
//
// # Crash guarantees
//
// Every change is recorded in the manifest (durably: temp file, fsync, rename, fsync of the
// directory) before it is made, as Pending, and committed by the manifest write that clears
// Pending. [Sandbox.Recover], which the supervisor runs under the sandbox's lifecycle lock
// before every transition and at start-up, finishes a pending rotation or rollback (forward:
// once recorded, every step of theirs can be redone) and undoes a pending copy (its layer is
// not named by anything yet), and removes leftovers. So a crash leaves the sandbox's files
// at one point or the other, never a mix.
//
// The package takes no locks: its caller holds the sandbox's lifecycle lock, and keeps the
// sandbox stopped, or frozen, as each operation says. It knows no runtime and no supervisor.
package checkpoint
