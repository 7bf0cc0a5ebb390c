// Package wire holds the syncmgr wire format shared by the daemon and its Go
// client: length-prefixed frames (frame.go), the request and reply envelopes
// and the handshake messages (message.go), the op, kind and argument names
// (names.go) and the error codes (errors.go).
//
// It knows nothing about what an op means; see docs/protocol.md for the
// contract and package manager for the semantics.
package wire
