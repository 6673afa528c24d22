//go:build linux

package platform

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

var bootID = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("platform: read boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("platform: empty boot id")
	}
	return id, nil
})

// BootID returns the kernel's random boot id, which changes at every boot: a process identity
// or a clock reading from another boot is meaningless in this one.
func BootID() (string, error) { return bootID() }

// MachineID returns the host's machine id (/etc/machine-id, or the D-Bus copy), which tells
// one host from another for template time contracts.
func MachineID() (string, error) {
	var lastErr error
	for _, p := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		b, err := os.ReadFile(p)
		if err != nil {
			lastErr = err
			continue
		}
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	}
	return "", fmt.Errorf("platform: no machine id: %w", lastErr)
}

func clock(id int32) (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		return 0, fmt.Errorf("platform: clock_gettime(%d): %w", id, err)
	}
	return time.Duration(ts.Nano()), nil
}

// Boottime returns CLOCK_BOOTTIME: time since boot, counting suspend, never set backwards. Only
// readings taken under the same BootID can be compared.
func Boottime() (time.Duration, error) { return clock(unix.CLOCK_BOOTTIME) }

// Monotonic returns CLOCK_MONOTONIC: time since boot, not counting suspend.
func Monotonic() (time.Duration, error) { return clock(unix.CLOCK_MONOTONIC) }
