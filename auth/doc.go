// Package auth implements the syncmgr handshake: a mutual HMAC-SHA256
// challenge-response over fresh 32-byte nonces, in which the client and the
// server each prove that they know the shared authkey without sending it.
// A client may speak first with a ready frame (ClientConfig.Ready), which a
// server announces it reads (Hello.Ready). The server calls its Penalty hook
// before answering a wrong MAC, and never for a right one.
//
// It also loads authkeys (hex, from the environment or a file) and makes new
// ones. The key is never formatted into an error or a log line by this
// package.
package auth
