// Package envd holds the wire protocol of E2B's in-sandbox daemon as bothyd serves it: the
// process and filesystem services, described in this project's own .proto files and generated
// into Go by protoc-gen-go and protoc-gen-connect-go (both pinned in go.mod's tool block; protoc
// itself comes from the system, e.g. Debian's protobuf-compiler). The generated packages are
// the wire's shape alone; e2b/ implements the services.
package envd

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-connect-go=$(go tool -n protoc-gen-connect-go) -I . --go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative process/process.proto filesystem/filesystem.proto"
