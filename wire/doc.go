// Package wire holds the syncmgr wire format shared by the daemon and its Go
// client: length-prefixed frames, the request and reply envelopes, the
// handshake messages and the error codes.
//
// It knows nothing about what an op means; see docs/protocol.md for the
// contract and package manager for the semantics.
package wire
