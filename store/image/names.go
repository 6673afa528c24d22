package image

import (
	"fmt"
	"strings"
)

// maxPath is the longest path Linux takes (PATH_MAX less its NUL).
const maxPath = 4095

// cleanName turns a tar entry name into a path relative to the layer's root ("" for the root
// itself), refusing what could name something outside it: an absolute path, a ".." element,
// a NUL byte, an over-long name.
func cleanName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("the name contains a NUL byte")
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("the name is an absolute path")
	}
	if len(name) > maxPath {
		return "", fmt.Errorf("the name is longer than %d bytes", maxPath)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return "", fmt.Errorf("the name has a \"..\" element")
		}
		if len(p) > 255 {
			return "", fmt.Errorf("the name has an element longer than 255 bytes")
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "/"), nil
}
