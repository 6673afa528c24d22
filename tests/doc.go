// Package tests holds bothyd's end-to-end tests: they build the real binary once, start it
// on a free loopback port with a temporary state root, and drive it over HTTP and websockets
// the way users do. Crash, race and load tests live here too; they use real processes.
package tests
