package control

import (
	"fmt"
	"sort"
)

// FeatureFileMeta is announced by an agent whose Handler is also a [FileMetaServer]: its
// stat and list answer a file's owner, group, symlink target and user metadata when the
// request asks for details ([FileRequest.Details]), its write stores the request's user
// metadata with the file ([FileRequest.Metadata]), and its watch refuses a directory on a
// network file system when asked ([WatchRequest.RefuseNetwork]). Like [FeatureWatch] it is not
// required: an agent without it ignores those fields, so [Client.WriteFile] refuses to send
// metadata to it rather than see it dropped.
const FeatureFileMeta = "file-meta"

// FileMetaServer is what a [Handler] implements to announce [FeatureFileMeta]; its file
// operations then honour the fields above.
type FileMetaServer interface {
	ServesFileMeta()
}

// MetadataXattrPrefix is the extended attribute namespace that holds a file's user
// metadata: key k is the attribute MetadataXattrPrefix+k. Only attributes under it are
// metadata; other user.* attributes are not reported.
const MetadataXattrPrefix = "user.e2b."

// Bounds of a file's user metadata, as E2B's envd has them: a key (without the prefix) is at
// most MaxMetadataKeyLen bytes (the kernel's 255-byte attribute name, less the prefix), and
// all keys, each with the prefix, plus all values are at most MaxMetadataBytes (within what
// one inode's attributes may take on ext4). The byte bound also bounds the count of keys.
const (
	MaxMetadataKeyLen = 255 - len(MetadataXattrPrefix)
	MaxMetadataBytes  = 4096
	// MaxOwnerLen bounds an owner or group name in a FileInfo; a longer one in the sandbox's
	// /etc/passwd or /etc/group is reported as the number.
	MaxOwnerLen = 256
)

// ValidateMetadata checks user metadata: keys of 1 to MaxMetadataKeyLen bytes of printable
// US-ASCII without space, values of printable US-ASCII, MaxMetadataBytes in all.
func ValidateMetadata(m map[string]string) error {
	total := 0
	for _, k := range sortedKeys(m) {
		v := m[k]
		if k == "" || len(k) > MaxMetadataKeyLen {
			return invalidf("The metadata key %q is not 1 to %d bytes long.", truncate(k), MaxMetadataKeyLen)
		}
		if !printable(k, false) {
			return invalidf("The metadata key %q is not printable US-ASCII without spaces.", truncate(k))
		}
		if !printable(v, true) {
			return invalidf("The value of metadata key %q is not printable US-ASCII.", truncate(k))
		}
		total += len(MetadataXattrPrefix) + len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return invalidf("The metadata takes %d bytes, more than the %d a file holds.", total, MaxMetadataBytes)
	}
	return nil
}

// checkDetails refuses a FileInfo whose details are beyond the bounds above: what an agent
// sends is not trusted to be bounded.
func (fi *FileInfo) checkDetails() error {
	switch {
	case len(fi.Owner) > MaxOwnerLen || len(fi.Group) > MaxOwnerLen:
		return fmt.Errorf("an owner or group of more than %d bytes", MaxOwnerLen)
	case len(fi.Target) > MaxPathLen:
		return fmt.Errorf("a symlink target of more than %d bytes", MaxPathLen)
	}
	if err := ValidateMetadata(fi.Metadata); err != nil {
		return fmt.Errorf("metadata beyond its bounds: %w", err)
	}
	return nil
}

func printable(s string, space bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c > 0x7e || c < 0x20 || (c == ' ' && !space) {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
