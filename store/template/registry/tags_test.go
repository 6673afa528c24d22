package registry

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/store/template"
)

// ociTag is the OCI distribution spec's rule for a tag: at most 128 characters.
var ociTag = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)

// TestLongestTagsFit: the longest template name and generation id the store accepts make
// tags (the generation's, its tombstone's and a mark's) that every registry must take.
func TestLongestTagsFit(t *testing.T) {
	tmpl := strings.Repeat("t", naming.MaxIDLen)
	gen := "g" + strconv.FormatUint(math.MaxUint64, 10)
	if err := template.ValidateName(tmpl); err != nil {
		t.Fatal(err)
	}
	if err := template.ValidateGeneration(gen); err != nil {
		t.Fatal(err)
	}
	if template.ValidateName(tmpl+"t") == nil {
		t.Fatalf("a template name of %d characters is valid: the bound this test takes is not the store's", len(tmpl)+1)
	}
	for _, tag := range []string{Tag(tmpl, gen), TombstoneTag(tmpl, gen), HeldTag(tmpl, gen, HolderID("node-a:/var/lib/bothy"))} {
		if !ociTag.MatchString(tag) {
			t.Errorf("the tag %q (%d characters) is not a valid OCI tag", tag, len(tag))
		}
	}
}
