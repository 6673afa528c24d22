package platform

import (
	"strings"

	"github.com/bothy/bothy/naming"
)

// The temporary names of durable writes have one fixed form, ".<name>.<random>.tmp", where
// <random> is tempRandomLen lowercase hex digits. Owners of a directory recognise their own
// leftovers by this exact form (IsTempName) and remove those, and nothing else.
const (
	tempPrefix    = "."
	tempSuffix    = ".tmp"
	tempRandomLen = 16
)

// TempName returns a fresh temporary name for a durable write of name.
func TempName(name string) string {
	return tempPrefix + name + "." + naming.RandomHex(tempRandomLen/2) + tempSuffix
}

// IsTempName reports whether entry has exactly the form TempName gives, and for which name.
func IsTempName(entry string) (name string, ok bool) {
	if !strings.HasPrefix(entry, tempPrefix) || !strings.HasSuffix(entry, tempSuffix) {
		return "", false
	}
	mid := entry[len(tempPrefix) : len(entry)-len(tempSuffix)]
	// mid is "<name>.<random>".
	if len(mid) < tempRandomLen+2 || mid[len(mid)-tempRandomLen-1] != '.' {
		return "", false
	}
	random := mid[len(mid)-tempRandomLen:]
	for i := 0; i < len(random); i++ {
		c := random[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	name = mid[:len(mid)-tempRandomLen-1]
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return "", false
	}
	return name, true
}
