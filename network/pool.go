package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// DefaultPool is the pool of sandbox addresses when the operator names none.
var DefaultPool = netip.MustParsePrefix("10.88.0.0/16")

// slotBits is the size of one sandbox's subnet: a /30 holds the network address, the host's
// end (the sandbox's gateway and resolver), the sandbox's end and the broadcast address.
const slotBits = 2

// ifPrefix starts the name of every host-side interface bothyd makes; [Manager.Leftovers]
// judges interfaces by it, so nothing else on the host may use it.
const ifPrefix = "sbxd"

// allocationFormat is the format number of an allocation record.
const allocationFormat = 1

// allocation is the durable record of one sandbox's network resources, written before any of
// them is made and removed after all of them are gone: whatever a crash leaves behind, the
// record names it, and a slot with a record is never handed to another sandbox.
type allocation struct {
	Format int    `json:"format"`
	ID     string `json:"id"`
	Pool   string `json:"pool"`
	Slot   uint32 `json:"slot"`
	// HostIf is the host end of the veth pair; the sandbox's end is always "eth0".
	HostIf string `json:"host_interface"`
}

// subnet returns the allocation's /30 within its pool.
func (a *allocation) subnet() (netip.Prefix, error) {
	pool, err := netip.ParsePrefix(a.Pool)
	if err != nil || !pool.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("network: the record of %s has a bad pool %q", a.ID, a.Pool)
	}
	if a.Slot >= slots(pool) {
		return netip.Prefix{}, fmt.Errorf("network: the record of %s has slot %d, outside its pool %s", a.ID, a.Slot, a.Pool)
	}
	base := pool.Addr().As4()
	n := binary.BigEndian.Uint32(base[:]) + a.Slot<<slotBits
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return netip.PrefixFrom(netip.AddrFrom4(b), 32-slotBits), nil
}

// Gateway returns the host's end of the allocation's subnet, and Address the sandbox's.
func (a *allocation) addrs() (gateway, address netip.Addr, err error) {
	sub, err := a.subnet()
	if err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	gateway = sub.Addr().Next()
	return gateway, gateway.Next(), nil
}

// slots is how many sandbox subnets pool holds.
func slots(pool netip.Prefix) uint32 {
	bits := 32 - pool.Bits() - slotBits
	if bits <= 0 {
		return 0
	}
	if bits >= 32 {
		return 1 << 31
	}
	return 1 << bits
}

// CheckPool checks that pool can be a pool of sandbox addresses: an IPv4 prefix, masked, with
// room for at least one sandbox, and not inside a range that is always denied.
func CheckPool(pool netip.Prefix) error {
	switch {
	case !pool.IsValid() || !pool.Addr().Is4():
		return fmt.Errorf("network: the pool %s is not an IPv4 CIDR", pool)
	case pool != pool.Masked():
		return fmt.Errorf("network: the pool %s has bits set beyond its prefix length; write %s", pool, pool.Masked())
	case slots(pool) == 0:
		return fmt.Errorf("network: the pool %s is too small; it needs at least a /%d", pool, 32-slotBits)
	case overlaps(pool, alwaysDenied):
		return fmt.Errorf("network: the pool %s overlaps addresses that are never routed (loopback, link-local, multicast)", pool)
	}
	return nil
}

// records reads the allocation records in dir, keyed by sandbox id. A file that is not a record
// (a temporary file of a durable write, say) is returned in others for the caller to judge.
func readRecords(dir string) (recs map[string]*allocation, others []string, err error) {
	d, err := platform.OpenDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("network: open the record directory: %w", err)
	}
	defer d.Close()
	names, err := platform.ReadDirNames(d)
	if err != nil {
		return nil, nil, fmt.Errorf("network: list the record directory: %w", err)
	}
	recs = map[string]*allocation{}
	for _, name := range names {
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || !naming.ValidID(id) {
			others = append(others, name)
			continue
		}
		data, err := platform.ReadFileAt(d, name, record.MaxSize)
		if err != nil {
			return nil, nil, fmt.Errorf("network: read the record of %s: %w", id, err)
		}
		a := &allocation{}
		if err := record.Decode(name, data, allocationFormat, a); err != nil {
			return nil, nil, err
		}
		if a.ID != id {
			return nil, nil, fmt.Errorf("network: the record %s names the sandbox %q", name, a.ID)
		}
		recs[id] = a
	}
	return recs, others, nil
}

// allocate returns the allocation of id, reading its record if it has one and otherwise
// choosing the lowest slot of pool that no record holds and recording it durably. The caller
// serialises allocations (one [Manager] per host, under its lock).
func allocate(dir, id string, pool netip.Prefix) (*allocation, error) {
	recs, _, err := readRecords(dir)
	if err != nil {
		return nil, err
	}
	if a, ok := recs[id]; ok {
		return a, nil
	}
	used := map[uint32]bool{}
	for _, a := range recs {
		if a.Pool == pool.String() {
			used[a.Slot] = true
		}
	}
	n := slots(pool)
	for slot := uint32(0); slot < n; slot++ {
		if used[slot] {
			continue
		}
		a := &allocation{Format: allocationFormat, ID: id, Pool: pool.String(), Slot: slot, HostIf: fmt.Sprintf("%s%x", ifPrefix, slot)}
		data, err := record.Encode(a)
		if err != nil {
			return nil, err
		}
		if err := platform.WriteFileDurable(dir, id+".json", data, record.Perm); err != nil {
			return nil, fmt.Errorf("network: record the allocation of %s: %w", id, err)
		}
		return a, nil
	}
	return nil, errcode.New(errcode.Unavailable, "The network pool %s has no free address for another sandbox; stop a networked sandbox or give bothyd a larger --network-pool.", pool)
}

// forget removes id's record, durably; a record already gone is not an error.
func forget(dir, id string) error {
	d, err := platform.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("network: open the record directory: %w", err)
	}
	defer d.Close()
	if err := platform.UnlinkAt(d, id+".json"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("network: remove the record of %s: %w", id, err)
	}
	return platform.SyncDir(d)
}

// removeOther removes a file of dir that is not a record, if it is a durable write's leftover.
func removeOther(dir, name string) error {
	if _, ok := platform.IsTempName(name); !ok {
		return nil
	}
	d, err := platform.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := platform.UnlinkAt(d, name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
