// Package systemd is what bothyd says to systemd when systemd runs it: readiness and shutdown
// through the notification socket (sd_notify), and log lines the journal files under their
// level. Off systemd (a terminal, a container, this project's test hosts) every function here
// does nothing, so the same binary runs with and without it.
//
// It must not manage cgroups or talk to systemd over D-Bus: where sandboxes' cgroups live is
// decided by the units (packaging/) and made by bothyd's own code, the same with and without
// systemd (docs/install.md, "Why a delegated holder unit").
package systemd
