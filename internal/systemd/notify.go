package systemd

import (
	"github.com/coreos/go-systemd/v22/daemon"
)

// Notify sends state (newline-separated assignments such as "READY=1\nSTATUS=serving") to the
// service manager that started this process, if one asked for notifications by setting
// NOTIFY_SOCKET. It reports whether a message was sent: false with no error when no manager
// listens, which is every run outside a Type=notify unit.
func Notify(state string) (bool, error) {
	// The variable stays set, since the server notifies twice (ready, then stopping). The
	// processes bothyd starts may inherit it, but systemd takes a Type=notify unit's
	// notifications from its main process only (NotifyAccess=main, the default).
	return daemon.SdNotify(false, state)
}

// Ready tells systemd that start-up is complete, with status as the line `systemctl status`
// shows. A Type=notify unit is "active" only from then on, so units ordered after it start
// only once it serves.
func Ready(status string) (bool, error) {
	return Notify(daemon.SdNotifyReady + "\nSTATUS=" + status)
}

// Stopping tells systemd that the process has begun to shut down, so that `systemctl status`
// says "deactivating" rather than waiting for it to exit.
func Stopping() (bool, error) {
	return Notify(daemon.SdNotifyStopping + "\nSTATUS=shutting down")
}
