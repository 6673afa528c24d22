//go:build !linux

package platform

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

// SeccompProgram is unsupported off Linux.
type SeccompProgram struct{}

// Len is zero off Linux.
func (p *SeccompProgram) Len() int { return 0 }

// LoadThread is unsupported off Linux.
func (p *SeccompProgram) LoadThread() error { return ErrUnsupported }

// LoadProcess is unsupported off Linux.
func (p *SeccompProgram) LoadProcess() error { return ErrUnsupported }

// MarshalBinary is unsupported off Linux.
func (p *SeccompProgram) MarshalBinary() ([]byte, error) { return nil, ErrUnsupported }

// UnmarshalBinary is unsupported off Linux.
func (p *SeccompProgram) UnmarshalBinary(b []byte) error { return ErrUnsupported }
