// Package shim is the microvm runtime's runtime process: sandboxd __vmshim <dir>, detached
// (its own session, outliving sandboxd), the parent of the sandbox's QEMU. Binaries run it,
// and the guest's init ([guest.Main]) which the same binary is inside the VM, through
// [Main]. It imports nothing of the host side: what it shares with the host-side driver
// (package microvm) is [Config] and the state directory's names, declared here.
//
// The shim holds one end of a socket pair whose other end is QEMU's chardev of the guest's
// virtio-serial port (-chardev socket,fd=3), and speaks package [portmux] on it. It makes
// the control socket itself, once the guest says its agent listens, and accepts on it: each
// connection becomes one session on the port, its bytes copied both ways. So the socket's
// listener is the shim, the process the driver's Start returns, and SO_PEERCRED names it to
// the supervisor, as the runtime contract requires; QEMU never touches the control socket.
package shim

import (
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/microvm/guest"
)

// The sub-commands of the runtime binary: the shim on the host, the guest init in the VM.
const (
	ShimCommand  = "__vmshim"
	GuestCommand = guest.Command
)

// Names the microvm runtime keeps in a state directory.
const (
	// EntryControl holds the control socket, SocketName, which the shim makes and listens on.
	EntryControl = "control"
	SocketName   = "control.sock"
	EntryLog     = "sandbox.log" // the shim's, QEMU's and the guest console's output
	// EntryOverlay is the sandbox's own disk: a qcow2 overlay whose backing file is the
	// image's read-only base disk, shared by every sandbox of the image.
	EntryOverlay = "disk.qcow2"
	// EntryAssets holds the initramfs and base disks when the spec names no shared
	// directory for them (Spec.HostBase "").
	EntryAssets = "vmbase"
)

// Config is what the host-side driver hands the shim on its fd 3.
type Config struct {
	Spec runtime.Spec `json:"spec"`
	// QEMU is the qemu-system-x86_64 to run; Accel "kvm" or "tcg".
	QEMU  string `json:"qemu"`
	Accel string `json:"accel"`
	// Kernel and Initramfs are the guest's kernel image and initramfs; Overlay its root disk.
	Kernel    string `json:"kernel"`
	Initramfs string `json:"initramfs"`
	Overlay   string `json:"overlay"`
	// TSCkHz is the host's TSC frequency, which a TCG guest's TSC runs at (QEMU reads the
	// host's): told on the kernel's command line, since the kernel's calibration against the
	// emulated PIT fails on a loaded host and the boot then hangs.
	TSCkHz int `json:"tsc_khz,omitempty"`
}

// Main runs the sub-command that args (os.Args[1:]) names, if it names one of this runtime's,
// and returns the exit code and whether it did. The guest's init is run as PID 1 by the guest
// kernel with [GuestCommand] as its only argument.
func Main(args []string) (code int, ran bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case ShimCommand:
		return shimMain(args[1:]), true
	case GuestCommand:
		return guest.Main(args[1:]), true
	}
	return 0, false
}

// QEMUArgs is QEMU's command line for cfg, with the port's chardev on fd 3 (probe: no disk,
// for the accelerator probe).
func QEMUArgs(cfg *Config, probe bool) []string {
	res := cfg.Spec.Resources
	cmdline := "console=ttyS0 panic=-1 quiet random.trust_cpu=on"
	if cfg.Accel == "tcg" && cfg.TSCkHz > 0 {
		cmdline += " tsc_early_khz=" + strconv.Itoa(cfg.TSCkHz) + " tsc=reliable"
	}
	args := []string{
		// The i8254 PIT, the PIC and the RTC are what the kernel calibrates its clock against
		// under TCG (no kvmclock, no HPET on microvm): without them it hangs at boot.
		"-M", "microvm,pcie=on,pit=on,pic=on,rtc=on", "-accel", cfg.Accel,
		"-m", strconv.Itoa(max(res.MemoryMB, 64)), "-smp", strconv.Itoa(max(res.VCPUs, 1)),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "stdio,id=console,signal=off", "-serial", "chardev:console",
		"-kernel", cfg.Kernel, "-initrd", cfg.Initramfs,
		"-append", cmdline + " -- " + GuestCommand,
		"-device", "virtio-serial-pci,disable-legacy=on",
		"-chardev", "socket,id=ctl,fd=3",
		"-device", "virtserialport,chardev=ctl,name=sandboxd",
	}
	if cfg.Accel == "tcg" {
		args = append(args, "-cpu", "max")
	} else {
		args = append(args, "-cpu", "host")
	}
	if !probe {
		args = append(args,
			"-drive", "if=none,id=root,format=qcow2,file="+optValue(cfg.Overlay),
			"-device", "virtio-blk-pci,drive=root,disable-legacy=on")
	}
	if !probe && cfg.Spec.Network {
		// QEMU makes the tap in the network namespace of its own that the shim starts it in;
		// the driver's JoinGuest brings it up and joins it to that namespace's eth0. Every
		// microVM is alone on its veth's layer 2, so QEMU's default MAC is no collision.
		args = append(args,
			"-netdev", "tap,id=net,ifname="+TapName+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net,disable-legacy=on")
	}
	return args
}

// TapName is the tap device QEMU makes in its network namespace for a networked microVM.
const TapName = "tap0"

// optValue escapes a value for QEMU's option syntax, where a comma is written twice.
func optValue(v string) string { return strings.ReplaceAll(v, ",", ",,") }
