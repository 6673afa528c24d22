//go:build !linux

package control

import (
	"errors"
	"io"
	"os"
)

// Descriptor passing is for Linux's unix sockets; elsewhere a connection never carries any,
// and FeatureStdoutPipe is neither announced nor used.

var errNoPassing = errors.New("control: descriptor passing needs Linux")

type fdSender struct{}

func (*fdSender) send(f *os.File) (uint64, error) {
	f.Close()
	return 0, errNoPassing
}

type fdReceiver struct{}

func (*fdReceiver) claim(uint64) (*os.File, error) { return nil, errNoPassing }

func senderConn(conn io.ReadWriteCloser) (io.ReadWriteCloser, *fdSender)     { return conn, nil }
func receiverConn(conn io.ReadWriteCloser) (io.ReadWriteCloser, *fdReceiver) { return conn, nil }
