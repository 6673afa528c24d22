package volume

import (
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/store"
)

// Sizes and counts of volumes (docs/security.md, "Bounds").
const (
	// DefaultSizeMB is a volume's size when a create names none.
	DefaultSizeMB = 1024
	// MinSizeMB is the smallest volume: below it ext4's own overhead takes most of it.
	MinSizeMB = 16
	// MaxSizeMB is the largest volume (1 TiB); the image is sparse, so only what is written
	// takes space on the state root.
	MaxSizeMB = 1 << 20
	// MaxVolumes is how many volumes a server keeps.
	MaxVolumes = 256
	// MaxMounts is how many volumes one sandbox mounts.
	MaxMounts = 16
	// MaxListEntries bounds a directory listing of a volume's files.
	MaxListEntries = 10000
)

// The codes of volume errors (package errcode).
const (
	CodeNotFound = errcode.VolumeNotFound
	CodeExists   = errcode.VolumeExists
	CodeInUse    = errcode.VolumeInUse
	CodeFull     = errcode.VolumeFull
)

// The states of a volume's record.
const (
	StateCreating = "creating"
	StateReady    = "ready"
	StateDeleting = "deleting"
)

// The changes a Store reports to its OnChange hook, named as the events they become
// (docs/design.md, "Events").
const (
	ChangeCreated = "volume.created"
	ChangeDeleted = "volume.deleted"
)

// RecordFormat is the format of volume.json.
const RecordFormat = 1

// Volume is a volume's record.
type Volume struct {
	Format    int       `json:"format"`
	Name      string    `json:"name"`
	SizeMB    int       `json:"size_mb"`
	CreatedAt time.Time `json:"created_at"`
	State     string    `json:"state"`
	// Holders are the sandboxes that hold the volume (filled in on reads, not recorded here).
	Holders []string `json:"-"`
	// UsedBytes is what the volume's file system has in use (filled in on reads of a mounted
	// volume).
	UsedBytes int64 `json:"-"`
}

// Mount is a volume mounted into a sandbox, as a create names it and the sandbox's
// configuration records it.
type Mount = store.VolumeMount

// CheckName checks a volume's name: the rule of sandbox ids (1-63 of a-z 0-9 -, starting
// with a letter or digit), since it names a directory.
func CheckName(name string) error {
	if naming.CheckID(name) != nil {
		return errcode.Invalid("name", "The volume name %q must be 1-%d characters of a-z, 0-9 and -, starting with a letter or digit.", trunc(name), naming.MaxIDLen)
	}
	return nil
}

// CheckSize checks a volume's size in MiB (0 is the default).
func CheckSize(sizeMB int) error {
	if sizeMB != 0 && (sizeMB < MinSizeMB || sizeMB > MaxSizeMB) {
		return errcode.Invalid("size_mb", "A volume's size must be %d to %d MiB; %d is outside it.", MinSizeMB, MaxSizeMB, sizeMB)
	}
	return nil
}

// reservedPaths are where no volume goes: the sandbox's own kernel file systems and
// bothyd's directory.
var reservedPaths = []string{"/proc", "/sys", "/dev", "/run/bothyd"}

// CheckMounts checks the volumes a create names: at most MaxMounts, each a valid name at a
// clean absolute path other than / that is not below /proc, /sys, /dev or /run/bothyd, no
// two at one path or one inside another. field names the request's field for errors.
func CheckMounts(field string, mounts []Mount) error {
	if len(mounts) > MaxMounts {
		return errcode.Invalid(field, "A sandbox mounts at most %d volumes; the create names %d.", MaxMounts, len(mounts))
	}
	for i, m := range mounts {
		f := fmt.Sprintf("%s[%d]", field, i)
		if naming.CheckID(m.Name) != nil {
			return errcode.Invalid(f+".name", "The volume name %q must be 1-%d characters of a-z, 0-9 and -, starting with a letter or digit.", trunc(m.Name), naming.MaxIDLen)
		}
		p := m.Path
		if len(p) > 4096 || strings.ContainsRune(p, 0) || !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" {
			return errcode.Invalid(f+".path", "A volume's mount path must be a clean absolute path below / (no . or .. components, no trailing /); %q is not.", trunc(p))
		}
		for _, r := range reservedPaths {
			if within(p, r) {
				return errcode.Invalid(f+".path", "A volume cannot be mounted at %q: %s belongs to the sandbox's own file systems. Choose another path.", trunc(p), r)
			}
		}
		for j, o := range mounts[:i] {
			if within(p, o.Path) || within(o.Path, p) {
				return errcode.Invalid(f+".path", "Volume mounts %d and %d are at %q and %q, one at or inside the other; give each a path of its own.", j, i, trunc(o.Path), trunc(p))
			}
		}
	}
	return nil
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func trunc(s string) string {
	if len(s) > 256 {
		return s[:256] + "..."
	}
	return s
}

func notFound(name string) error {
	return errcode.New(CodeNotFound, "No volume is named %q; list them with GET /v1/volumes, or create it first.", trunc(name))
}

// The sandbox's workload user, uid and gid 1000 on disk in every sandbox (each sandbox's
// idmapped mount maps it to that sandbox's own host id): a volume's root and the files the
// API writes are its.
const (
	userUID = 1000
	userGID = 1000
)

// Entry is a file of a volume, as the files API shows it.
type Entry struct {
	Name string
	// Path is absolute, from the volume's root.
	Path    string
	Type    string // "file", "directory", "symlink" or "other"
	Size    int64
	Mode    uint32 // the permission bits
	UID     uint32
	GID     uint32
	ModTime time.Time
	ATime   time.Time
	CTime   time.Time
	// Target is a symbolic link's target, as written (never followed).
	Target string
}

// WriteOptions are a write's or a mkdir's owner and mode; nil means the sandbox's user
// (1000:1000) and 0644 for a file, 0755 for a directory.
type WriteOptions struct {
	UID, GID *uint32
	Mode     *uint32
	// Parents makes missing parent directories, as mkdir -p does.
	Parents bool
}

func (o WriteOptions) owner() (int, int) {
	uid, gid := userUID, userGID
	if o.UID != nil {
		uid = int(*o.UID)
	}
	if o.GID != nil {
		gid = int(*o.GID)
	}
	return uid, gid
}
