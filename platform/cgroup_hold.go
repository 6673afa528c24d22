package platform

import "errors"

// ErrNoUnifiedCgroup is HoldCgroup's answer on a host whose /sys/fs/cgroup is not a cgroup v2
// hierarchy (cgroup v1, or v1 and v2 side by side): there systemd delegates no v2 controllers
// to a unit, and sandboxes' cgroups live in the v1 hierarchies.
var ErrNoUnifiedCgroup = errors.New("/sys/fs/cgroup is not a cgroup v2 hierarchy")
