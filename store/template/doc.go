// Package template is the template store: named series of generations (captured writable
// layers of stopped sandboxes, with their compatibility key and time contract), the leases
// that clones hold on them, tombstones, and retirement. It lives under
// <state root>/templates.
//
// It knows nothing about HTTP, runtimes or the sandbox store: it hands out a lock, records
// and payload paths, and returns typed errors ([errcode.Error]). It must never delete a
// generation that a clone's binding names, never follow a link inside the store, and never
// remove an entry it does not own.
//
// # On-disk layout
//
//	templates/                         0700
//	  templates.lock                   the store's lock (flock)
//	  <name>/                          one template, 0700; <name> as a sandbox id
//	    template.json                  the template record; its presence means "exists"
//	    .g000004.<random>.tmp/         a capture's staging directory (flocked while alive)
//	    g000001/                       one generation, 0700
//	      index.json                   the index entry: key, time contract, captured_at, size
//	      payload/                     the captured layer: the lower layer of clones
//	      tombstone.json               present when quarantined; "drain" = retire when drained
//	      leases/<lease-id>.json       one lease record per clone
//
// Every record is JSON with a "format" number first; a record with a format this version does
// not know is refused with an error naming the format ([FormatError]). Records are written
// atomically and durably (a temp file ".<name>.<random>.tmp" in the same directory, fsync,
// rename, fsync of the directory), so lock-free readers ([Store.Templates],
// [Store.Generations], [Store.Leases]) see whole records. Names are validated before they touch
// a path: template names as sandbox ids, generation ids as "g" and at least six digits (never
// reused within a template: the counter in template.json only grows), lease ids as "l-" and 16
// hex digits. All access goes through directory handles with O_NOFOLLOW; a record that is a
// link, FIFO or device is refused. Temp files and staging directories have the one temp-name
// form, and only those this store makes are removed (by the next operation on the template, or
// by [Store.Check]); any other entry is foreign, reported by name and kept.
//
// # The lock
//
// One lock file, templates.lock, serializes every change of the store across threads and
// processes: an exclusive flock, tried every 25 ms until the caller's deadline, then
// transition-in-progress (as the sandbox store's lifecycle lock). flock dies with its
// process, so a crashed holder never wedges the store. The lock is held for short record
// operations only: a capture copies without it (see Capture).
//
// # Eligibility
//
// A generation's time contract is the host's machine id, its boot id, a CLOCK_BOOTTIME
// reading and UTC at capture. The downtime at a later host time is measured by the monotonic
// clock when host, boot and clock name are the capture's, and by UTC otherwise; negative is
// early, more than [Options.MaxAge] (30 days) is expired. CLOCK_BOOTTIME rather than
// CLOCK_MONOTONIC because a suspended host's downtime is real time for the captured state
// (its caches, its tokens, its clocks): MONOTONIC stops during suspend and would call a
// generation fresh that is not. Neither can be set, so within one boot a wrong or stepped
// wall clock cannot make a generation early or expired; across boots only UTC remains. A host
// without a machine id (a slim container) records an empty host id; the boot id, random per
// boot, still tells whether a monotonic reading can be compared.
//
// # The lease protocol
//
// Cloning (the supervisor's Clone, docs/design.md) follows this order:
//
//	tx, _ := ts.Lock(ctx)                         // 1. the template store's lock
//	now, _ := ts.Now()
//	g, _ := tx.Leasable(name, gen, now)           // 2. the generation: indexed, not tombstoned,
//	   // or tx.Select(name, key, now)            //    eligible (and, by Select, of the key)
//	sl, _ := sandboxes.LockForProvision(ctx, id)  // 3. then the new sandbox's lifecycle lock
//	sl.RequireUnprovisioned()                     // 4. the sandbox: not provisioned, and no
//	CheckUnbound(sl.Dir(), id)                    //    lease (clone.json)
//	sl.WriteConfig(cfg)                           // 5. its configuration, naming the template
//	l, _ := tx.WriteLease(name, g.ID, id)         // 6. the lease record, durably
//	WriteBinding(sl.Dir(), NewBinding(l))         // 7. then the sandbox's clone.json, durably
//	sl.Unlock(); tx.Unlock()
//
// If step 6 or 7 fails, the provision is undone before the locks are released.
//
// Removal reverses it: [RemoveBinding] (durably) first, then [Store.Release] removes the lease
// record. So at every instant, and after a crash at any point, every clone.json names a lease
// record that exists: the lease is written before the binding and removed after it. The
// converse does not hold: a crash between the two steps leaves a lease record without a
// binding. Such a lease only delays a retirement; retirement sweeps it, asking bindingExists
// ([BindingChecker]) under the store's lock. Because cloning holds the store's lock from its
// checks until its binding is durable, a retirement never sees a lease whose binding is still
// to come.
//
// The lock order is the template store's lock, then a sandbox's lifecycle lock. A removal that
// holds a sandbox's lock must not wait for the template store's lock: remove clone.json under
// the sandbox lock, release that lock, then call [Store.Release] (the lease left meanwhile is
// harmless, see above); or take the template store's lock first.
//
// # Retirement
//
// [Store.Tombstone] writes tombstone.json: [Tx.Leasable] and [Tx.WriteLease] refuse the
// generation (template-tombstoned), [Tx.Select] skips it, and existing clones keep their lower
// layer. [Store.Retire] tombstones first (durably), then sweeps stale leases; if leases remain
// it answers generation-leased naming them (drain: it marks the tombstone "retire when drained"
// and answers [Draining], and [Store.Release] of the last lease finishes). With no lease left
// it deletes the payload, then the index entry, then the tombstone, each step durable before
// the next, then the generation's directory.
//
// Why this order: the tombstone comes first and is durable before anything is deleted, so from
// that point no new lease can appear and nothing is deleted under a clone. The payload goes
// while the index entry and tombstone still say what the directory is, so an interruption
// leaves a quarantined, recognisable generation, never an indexed generation without its
// payload that a clone could lease; the tombstone goes last so that until the very end the
// generation reads as quarantined. Retiring again (or [Store.Check] with repair) finishes it.
// [Store.DeleteTemplate] retires every generation, and the template record goes when the last
// generation is gone (with drain, when the last lease is released).
//
// # Capture
//
// [Store.Capture] (and [Store.CaptureLayers]) reserves the next generation id under the lock
// (the counter in template.json, durably) and creates a staging directory named by the temp
// form of that id, on which it holds an flock; it then copies the source layer without the
// store's lock (so clones are never held up by a copy), fsyncs every file and directory, writes
// the index entry into staging, and under the lock renames the staging directory to the
// generation id and fsyncs the template's directory. The generation thus appears with its
// payload and index entry at once. A crash leaves a staging directory whose flock died with its
// process; the next operation on the template removes it, and never one whose flock is held.
//
// # Faults
//
// Every error the store returns passes through [errcode.Storage] (storage-full for ENOSPC and
// EDQUOT, storage-unavailable for EROFS and EIO, naming the state root), and every change on
// disk goes through Options.FS, so that tests fail any step. A failed step leaves nothing the
// caller was told was not made: a record that did not exist (template.json of a create, a
// lease record, a tombstone, an index entry) is removed again if the failure came after its
// rename; a create removes the template directory it made; a reservation removes its staging
// directory; a commit whose final fsync fails renames the generation back to staging and
// removes it, so a failed capture lists no generation. When an undo fails too (the file system
// went read-only), what stays is whole and judged by Check: a staging directory or temp file
// (staging-leftover), an empty template directory (interrupted-delete), a lease without its
// binding (lease-without-binding), or a generation that is whole.
//
// Deleting needs no space. Retirement writes its tombstone first; when the disk is full and
// no lease holds the generation, it quarantines it instead by removing its index entry (an
// unlink: a generation without one is never leased or selected) and then deletes the rest. An
// interruption leaves a payload without an index entry, which Check's repair retires without
// a tombstone on a full disk. A leased generation cannot be quarantined without its
// tombstone; its retirement answers storage-full and changes nothing: delete its clones first.
//
// # Durability order as a contract
//
// [Options.OnSync] is called after every durable step with the Step* names; tests assert the
// order of these calls and crash tests kill the process at each of them.
package template
