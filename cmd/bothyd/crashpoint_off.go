//go:build !crashpoints

package main

// crashPoint is nil in a release build: only a bothyd built with the crashpoints tag, for the
// end-to-end crash tests, kills itself at a named step (crashpoint_on.go).
func crashPoint() func(string) { return nil }
