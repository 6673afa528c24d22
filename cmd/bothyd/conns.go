package main

import "github.com/bothy/bothy/server"

// maxConns is the server's bound on open connections: its default, or a quarter of the
// descriptors bothyd has if that is less, so that connections never take the descriptors
// sandboxes, stores and logs need.
func maxConns(noFile uint64) int {
	if noFile > 0 && noFile/4 < server.DefaultMaxConns {
		return int(max(noFile/4, 16))
	}
	return server.DefaultMaxConns
}
