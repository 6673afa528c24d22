package errcode

import (
	"errors"
	"syscall"
)

// StorageFault is what [StorageFaultOf] finds in an error: whether the file system beneath
// failed the operation, and how.
type StorageFault int

const (
	// NoStorageFault: the error is not one of the storage errnos below (or is nil).
	NoStorageFault StorageFault = iota
	// FaultFull: ENOSPC or EDQUOT. Freeing space (or raising the quota) cures it; deleting is
	// the way to free it, so removals must not need space.
	FaultFull
	// FaultUnavailable: EROFS or EIO. The file system is read-only (often the kernel's own
	// remount after an I/O error) or failing; only the operator can cure it.
	FaultUnavailable
)

// StorageFaultOf classifies err by the errno anywhere in its chain. It is the one table of
// which errnos count as faults of the storage: ENOSPC and EDQUOT as full, EROFS and EIO as
// unavailable. Other errnos (EACCES, EMFILE, ENOENT, ...) are not storage faults: they say
// something about the request or the process, not about the file system's state.
func StorageFaultOf(err error) StorageFault {
	switch {
	case err == nil:
		return NoStorageFault
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return FaultFull
	case errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EIO):
		return FaultUnavailable
	}
	return NoStorageFault
}

// Storage returns err with the code of its storage fault, for an operation on the state root
// root: storage-full for ENOSPC and EDQUOT, storage-unavailable for EROFS and EIO, with a
// message that names the state root and says what to do. The errno stays reachable through
// errors.Is (errors.Is(err, syscall.ENOSPC) still holds). Any other error, nil, and an error
// that already carries one of the two codes (or volume-full) are returned as they are, so that the function
// may be applied at every boundary an error crosses.
//
// The stores apply it to every error they return; other components that write under the
// state root (the supervisor's capability file, the runtime's layers) should too.
func Storage(err error, root string) error {
	fault := StorageFaultOf(err)
	if fault == NoStorageFault {
		return err
	}
	// A volume that fills is the volume's own file system, not the state root's.
	if c := Of(err); c == StorageFull || c == StorageUnavailable || c == VolumeFull {
		return err
	}
	if fault == FaultFull {
		return Wrap(StorageFull, err,
			"The state root %s is full: delete sandboxes or templates you no longer need, or free space on its file system.", root)
	}
	what := "is read-only"
	if errors.Is(err, syscall.EIO) {
		what = "reports I/O errors"
	}
	return Wrap(StorageUnavailable, err,
		"The file system of the state root %s %s: reads still work, but nothing can be created or changed until the operator repairs it or remounts it read-write.", root, what)
}
