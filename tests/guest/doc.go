// Package guest is the proof on the hosts users run (issue 36, item 6): a suite that drives a
// Debian 12 VM with systemd and cgroup v2 only, booted by scripts/guest/run from the image
// scripts/guest/build made, from the host — over ssh for what a user does at a shell (install
// the .deb, systemctl, reboot, apt purge) and over bothyd's API through QEMU's forwarded port
// for what a client does.
//
// It runs only where scripts/guest/test (or a user with scripts/guest/run up) has booted a
// guest and exported its environment (BOTHY_GUEST_SSH_PORT, BOTHY_GUEST_KEY, BOTHY_GUEST_API);
// elsewhere, `go test ./...` included, it skips, saying so. The steps are subtests of one test,
// in order, each building on the guest the previous ones left; a step that fails stops the
// ones after it that need its result.
//
// It must not run on the host: every step changes the machine it runs on (packages, units,
// network namespaces, Docker's firewall, a reboot).
package guest
