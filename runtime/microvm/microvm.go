// Package microvm is the host-side driver of the microvm runtime ([runtime.Runtime]): each
// sandbox is a QEMU microVM (-M microvm,pcie=on, modern-only virtio) with a kernel of its own,
// the Debian cloud kernel, booting an initramfs whose /init is the runtime binary itself
// (package [guest]) and a root disk that is a qcow2 overlay of the sandbox's own over a
// read-only base disk shared by every sandbox of the image. The agent (package agent) runs
// in the guest as PID 1 and serves the control protocol over a virtio-serial port; the shim
// (package [shim]) on the host is the runtime process: it owns the control socket, carries
// each connection to the guest as one session of the port (package [portmux]), starts QEMU as
// its child, and writes the outcome report when QEMU exits. Volumes (runtime.VolumeMounter)
// reach the guest through virtio-fs, a virtiofsd per volume that the shim starts beside QEMU
// (docs/volumes.md).
//
// See docs/microvm.md for the design, what works on which host, and the figures measured.
package microvm

// Kind is this runtime's kind.
const Kind = "microvm"
