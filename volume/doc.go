// Package volume keeps bothyd's volumes: named file systems of a fixed size that outlive the
// sandboxes that mount them, several at once, and whose files the API reads and writes
// without any sandbox. It owns <root>/volumes and nothing else; it knows nothing of HTTP or
// of sandboxes beyond their ids (the supervisor says whether a sandbox still holds a volume).
//
// # Mechanism
//
// Each volume is an ext4 file system in a sparse file, <root>/volumes/<name>/disk.img,
// attached to a loop device and mounted on the host at <root>/volumes/<name>/mnt
// (nosuid, nodev). The kernel enforces the size: a write past it fails with ENOSPC, inside a
// sandbox as through the API (which answers 507 volume-full). The choice over project quotas
// (which the state root's ext4 here is not mounted with: no prjquota option) or a directory
// with no limit: a loop-mounted image needs nothing of the state root's file system, moves
// as one file, takes idmapped mounts (ext4 does, from Linux 5.12) so that ownership follows
// each sandbox's user namespace, and is the block device that the microVM runtime would
// attach (docs/volumes.md says what that runtime does today). Its cost: the file system's
// own overhead (journal, inode tables: about 5% of a small volume) is part of the size, and a
// loop device per volume.
//
// One host mount per volume, one superblock: sandboxes get clones of that mount (the
// namespace runtime's shim clones it idmapped into each sandbox), so every sandbox that
// mounts a volume and the API see one file system, and each other's writes at once. A
// second loop device on the same image would be a second superblock over the same blocks,
// which corrupts the file system: mounting always looks for a device already backed by the
// image first ([Store.Recover]).
//
// # Records and crashes
//
// A volume's record (volume.json) is written durably before anything of it is made, in state
// creating; ready once made and mounted; deleting before its teardown. A crash leaves a
// volume creating (half-made: removed at start-up and by check --repair), deleting (the
// teardown is finished), or ready (remounted at start-up if the mount is gone). A sandbox
// that names a volume holds it: holds/<sandbox id>, written durably before the sandbox's
// configuration record, removed after the sandbox is deleted. A hold whose sandbox does not
// exist, or does not name the volume, is stale and goes (the supervisor's HeldBy says
// which). A volume that a live hold names is not deleted (423 volume-in-use).
//
// # Host-side file access
//
// A volume's files are the sandboxes' to shape: links, hard links, FIFOs, device nodes. The
// files API resolves every path inside the volume's root (openat2 RESOLVE_IN_ROOT,
// RESOLVE_NO_MAGICLINKS, RESOLVE_NO_XDEV), opens final components with O_NOFOLLOW and
// O_NONBLOCK, reads regular files only, writes through a temporary file renamed into place,
// and checks before each operation that the root it opens is the volume's own file system,
// never the state root's under an absent mount.
package volume
