// Package wire holds the syncmgr wire format shared by the daemon and its Go
// client: length-prefixed frames (frame.go), the request decoder the daemon
// runs for every op (request.go: it reads a body's bytes directly and is
// fuzzed against the msgpack decoder), the request and reply encoders, the
// reply decoder and the Marshal/Unmarshal helpers the handshake messages of
// package auth use (message.go), the op, kind and
// argument names (names.go) and the error codes (errors.go).
//
// It knows nothing about what an op means; see docs/protocol.md for the
// contract and package manager for the semantics.
package wire
