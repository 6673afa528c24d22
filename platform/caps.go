package platform

// DefaultCapabilities is the capability set a root workload keeps, Docker's default set minus
// CAP_MKNOD (bothyd has no devices cgroup to make device nodes harmless, so none may be
// made) — enough for package managers and servers on low ports, nothing that reaches the
// kernel's administrative interfaces.
var DefaultCapabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FSETID",
	"CAP_FOWNER",
	"CAP_NET_RAW",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETFCAP",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT",
	"CAP_KILL",
	"CAP_AUDIT_WRITE",
}
