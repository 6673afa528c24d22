package check

import (
	"path/filepath"
	"time"

	"github.com/bothy/bothy/idempotency"
	"github.com/bothy/bothy/secret"
)

// WebhooksInUse is a note: a running server holds the webhooks' lock, so their records were
// only read, and what an interrupted write of that server left is its own start-up's to clean.
const WebhooksInUse = "webhooks-in-use"

// WebhooksUnchecked is reported when the webhooks' records could not be checked at all.
const WebhooksUnchecked = "webhooks-unchecked"

// webhooksDir is where the webhooks' records are in the state root (package webhook's Dir).
const webhooksDir = "webhooks"

// StoreCheck is the check of records that the checker cannot import (package webhook links
// net/http, which no package below the HTTP layer may): cmd/bothyd hands it in. It returns
// the problems found, with Entry relative to the state root (repaired ones marked, with
// repair), and whether a running server holds the records' lock, in which case it only read.
type StoreCheck func(repair bool) (problems []Problem, busy bool, err error)

// checkWebhooks runs the webhooks' own check, read-only or with repair, reporting its problems
// with their own kinds.
func (c *checker) checkWebhooks(p *pass, repair bool) {
	if c.o.Webhooks == nil {
		return
	}
	probs, busy, err := c.o.Webhooks(repair)
	if err != nil {
		p.add(WebhooksUnchecked, "", webhooksDir, "the webhooks' records could not be checked: %v", err)
		return
	}
	if repair {
		if busy {
			c.o.Logger.Warn("check: a running server holds the webhooks' lock; their records are not repaired")
		}
		return
	}
	if busy {
		p.note(WebhooksInUse, "", webhooksDir, "a running server delivers the webhooks; their records were only read")
	}
	p.problems = append(p.problems, probs...)
}

// checkIdempotency runs the idempotent creates' check ([idempotency.Check]): it is safe beside
// a running server, so repair runs whether one runs or not.
func (c *checker) checkIdempotency(p *pass, repair bool) {
	probs, err := idempotency.Check(c.root, repair, time.Now())
	if err != nil {
		p.add(idempotency.BadRecord, "", idempotency.Dir, "the kept answers could not be checked: %v", err)
		return
	}
	if repair {
		return
	}
	for _, ip := range probs {
		p.add(ip.Kind, "", ip.Entry, "%s", ip.Detail)
	}
}

// volumesDir is the volumes' directory in the state root (package volume's Dir).
const volumesDir = "volumes"

// VolumesUnchecked is reported when the volumes could not be checked at all.
const VolumesUnchecked = "volumes-unchecked"

// checkVolumes runs the volumes' own check, read-only or with repair (which it does under
// the volume store's lock, beside a running server too), reporting its problems with their
// own kinds.
func (c *checker) checkVolumes(p *pass, repair bool) {
	c.runStoreCheck(p, c.o.Volumes, repair, VolumesUnchecked, volumesDir, "the volumes")
}

// checkSecrets runs the secrets' own check ([secret.Check]): what it repairs (temporary
// files of interrupted writes) is as safe beside a running server as the idempotent creates'.
func (c *checker) checkSecrets(p *pass, repair bool) {
	probs, err := secret.Check(c.root, repair)
	if err != nil {
		p.add(secret.BadRecord, "", secret.Dir, "the secrets' records could not be checked: %v", err)
		return
	}
	if repair {
		return
	}
	for _, sp := range probs {
		p.add(sp.Kind, "", filepath.Join(secret.Dir, sp.Entry), "%s", sp.Detail)
	}
}

// checkEgress runs the egress proxy's check of its CA's files: only temporary files of
// interrupted writes, which are safe to remove beside a running server (it writes the CA once,
// at its start-up, before it serves).
func (c *checker) checkEgress(p *pass, repair bool) {
	c.runStoreCheck(p, c.o.Egress, repair, "egress-unchecked", "egress", "the egress proxy's CA")
}

// runStoreCheck runs a store's own check given through Options (none: nothing to do),
// reporting its problems with their own kinds, or one problem of kind unchecked at entry
// when it could not run at all.
func (c *checker) runStoreCheck(p *pass, check StoreCheck, repair bool, unchecked, entry, what string) {
	if check == nil {
		return
	}
	probs, _, err := check(repair)
	if err != nil {
		p.add(unchecked, "", entry, "%s could not be checked: %v", what, err)
		return
	}
	if !repair {
		p.problems = append(p.problems, probs...)
	}
}
