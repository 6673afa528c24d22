// Package shim is the microvm runtime's runtime process: bothyd __vmshim <dir>, detached
// (its own session, outliving bothyd), the parent of the sandbox's QEMU. Binaries run it,
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

	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/guest"
)

// The sub-commands of the runtime binary: the shim on the host, the guest init in the VM.
const (
	ShimCommand  = "__vmshim"
	GuestCommand = guest.Command
	// FSCommand is the helper the shim starts for each volume: it makes the volume's view
	// (read-only for a read-only mount) in a mount namespace of its own and becomes
	// virtiofsd there ([fsdMain]).
	FSCommand = "__vmfsd"
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
	// QMPName is QEMU's monitor socket in EntryControl, which only the host-side driver
	// and the shim dial (to stop, save and continue the VM).
	QMPName = "qmp.sock"
	// ShimSocketName is the shim's own socket in EntryControl: the driver asks it to
	// release the VM's memory and to restore it.
	ShimSocketName = "shim.sock"
	// EntryMemory holds a launch's released memory (StateMemory and StateMeta) while its
	// QEMU is gone; it goes once the memory is restored, or with the launch.
	EntryMemory = "memory"
)

// The files of a saved memory state (a directory: a memory generation's payload).
const (
	// StateMemory is QEMU's migration stream: the guest's memory and device state.
	StateMemory = "memory.state"
	// StateMeta is the state's description ([StateInfo]).
	StateMeta = "vm.json"
	// StateDisk is the disk overlay frozen with the memory: a clone's own overlay is made
	// over it.
	StateDisk = "disk.qcow2"
)

// StateInfo is a saved state's vm.json: what a restore must match or know.
type StateInfo struct {
	Format int `json:"format"`
	// Port is the port the guest served on when the state was saved; a restore serves on
	// the other (see guest.PortDevices).
	Port int `json:"port"`
	// Accel, VCPUs and MemoryMB are the saved VM's: a restore runs with the same.
	Accel    string `json:"accel"`
	VCPUs    int    `json:"vcpus"`
	MemoryMB int    `json:"memory_mb"`
	// NIC says that the saved devices include the guest's NIC (a networked launch's): a
	// restore starts QEMU with it, in a network namespace of its own, whatever the restoring
	// launch's policy, since the state loads only into exactly the saved device set. A state
	// with a NIC is of StateFormatNIC, which a build that knows no NIC refuses rather than
	// restore without it.
	NIC bool `json:"nic,omitempty"`
	// Volumes is how many volumes the launch mounts (a running launch's record only): their
	// virtio-fs devices cannot be migrated, so its memory is never saved.
	Volumes int `json:"volumes,omitempty"`
}

// StateFormat is StateInfo's record format, StateFormatNIC that of a state with a NIC.
const (
	StateFormat    = 1
	StateFormatNIC = 2
)

// StateInfoFormat is the format of a state info with or without a NIC.
func StateInfoFormat(nic bool) int {
	if nic {
		return StateFormatNIC
	}
	return StateFormat
}

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
	// QMP is the path of QEMU's monitor socket; "" for none.
	QMP string `json:"qmp,omitempty"`
	// Port is the port the guest serves on (see guest.PortDevices): 0 for a boot, the port
	// idle at the save for a restore.
	Port int `json:"port,omitempty"`
	// Restore, when set, starts QEMU from a saved memory state rather than booting.
	Restore *Restore `json:"restore,omitempty"`
	// NIC gives the guest its NIC (a tap in a network namespace of QEMU's own): a boot's
	// when Spec.Network says so, a restore's when the saved state has one.
	NIC bool `json:"nic,omitempty"`
	// VirtioFSD is the virtiofsd that serves Spec.Volumes to the guest (docs/volumes.md):
	// "" when the spec names none.
	VirtioFSD string `json:"virtiofsd,omitempty"`
}

// Restore is a launch from a saved memory state.
type Restore struct {
	// Memory is the state's migration stream (StateMemory), read by QEMU's -incoming.
	Memory string `json:"memory"`
	// ClockAdvanceNS is how far the guest's clock is advanced: the state's downtime.
	ClockAdvanceNS int64 `json:"clock_advance_ns"`
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
	case FSCommand:
		return fsdMain(args[1:]), true
	}
	return 0, false
}

// QEMUArgs is QEMU's command line for cfg, with the ports' chardevs on fds 3 and 4, a
// restore's migration stream on fd 5 and the volumes' virtiofsd connections from FSFirstFD (probe: no disk, one port on fd 3, no monitor, for the
// accelerator probe). A restore's command line must give the saved VM's devices exactly.
func QEMUArgs(cfg *Config, probe bool) []string {
	res := cfg.Spec.Resources
	cmdline := "console=ttyS0 panic=-1 quiet random.trust_cpu=on"
	if cfg.Accel == "tcg" && cfg.TSCkHz > 0 {
		cmdline += " tsc_early_khz=" + strconv.Itoa(cfg.TSCkHz) + " tsc=reliable"
	}
	memMB := strconv.Itoa(max(res.MemoryMB, 64))
	machine := "microvm,pcie=on,pit=on,pic=on,rtc=on"
	vols := !probe && len(cfg.Spec.Volumes) > 0
	if vols {
		// virtiofsd reads and writes the guest's buffers in its memory directly (vhost-user):
		// the guest's RAM must be a shared mapping it can map. Only a VM with volumes gets
		// it, so that the RAM block of every other VM stays the one its memory generations
		// were saved with.
		machine += ",memory-backend=ram"
	}
	args := []string{
		// The i8254 PIT, the PIC and the RTC are what the kernel calibrates its clock against
		// under TCG (no kvmclock, no HPET on microvm): without them it hangs at boot.
		"-M", machine, "-accel", cfg.Accel,
		"-m", memMB, "-smp", strconv.Itoa(max(res.VCPUs, 1)),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "stdio,id=console,signal=off", "-serial", "chardev:console",
		"-kernel", cfg.Kernel, "-initrd", cfg.Initramfs,
		"-append", cmdline + " -- " + GuestCommand,
		"-device", "virtio-serial-pci,disable-legacy=on",
		"-chardev", "socket,id=ctl,fd=3",
		"-device", "virtserialport,chardev=ctl,name=bothyd",
	}
	if cfg.Accel == "tcg" {
		args = append(args, "-cpu", "max")
	} else {
		args = append(args, "-cpu", "host")
	}
	if !probe {
		args = append(args,
			"-chardev", "socket,id=ctl1,fd=4",
			"-device", "virtserialport,chardev=ctl1,name=bothyd1",
			"-drive", "if=none,id=root,format=qcow2,file="+optValue(cfg.Overlay),
			"-device", "virtio-blk-pci,drive=root,disable-legacy=on")
		if cfg.QMP != "" {
			args = append(args, "-chardev", "socket,id=qmp,server=on,wait=off,path="+optValue(cfg.QMP),
				"-mon", "chardev=qmp,mode=control")
		}
		if cfg.Restore != nil {
			args = append(args, "-incoming", "fd:5")
		}
	}
	if vols {
		args = append(args, "-object", "memory-backend-memfd,id=ram,share=on,size="+memMB+"M")
		for i := range cfg.Spec.Volumes {
			n := strconv.Itoa(i)
			args = append(args,
				"-chardev", "socket,id=fs"+n+",fd="+strconv.Itoa(FSFirstFD+i),
				"-device", "vhost-user-fs-pci,queue-size=1024,chardev=fs"+n+",tag="+guest.VolumeTag(i))
		}
	}
	if !probe && cfg.NIC {
		// QEMU makes the tap in the network namespace of its own that the shim starts it in;
		// the driver's JoinGuest brings it up and joins it to that namespace's eth0. The MAC
		// stays QEMU's default, as a restore's device must match the saved one; the guest's
		// agent gives the NIC a MAC of its address (guest.nicMAC).
		args = append(args,
			"-netdev", "tap,id=net,ifname="+TapName+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net,disable-legacy=on")
	}
	return args
}

// FSFirstFD is QEMU's descriptor of the first volume's vhost-user connection (to its
// virtiofsd); the i-th volume's is FSFirstFD+i. Fd 5 is a restore's migration stream, which a
// VM with volumes never has (its devices cannot be migrated), but the numbers stay apart.
const FSFirstFD = 6

// TapName is the tap device QEMU makes in its network namespace for a networked microVM.
const TapName = "tap0"

// optValue escapes a value for QEMU's option syntax, where a comma is written twice.
func optValue(v string) string { return strings.ReplaceAll(v, ",", ",,") }
