// Package server is syncmgr's socket transport: it accepts connections on
// Unix and TCP listeners, runs the handshake, reads frames, and maps each
// request to package manager. It holds no object semantics of its own.
//
// Each connection has one goroutine that reads and executes requests in
// order. A request that has to wait is parked in a goroutine of its own with
// a context derived from the connection's; when the connection ends, that
// context is cancelled, every parked request is finished (a grant that raced
// in is handed back), and only then is the connection's session closed, so a
// dead client never takes a lock or a queue item.
package server
