package wire

import (
	"errors"
	"fmt"
)

// Code is a wire error code. Codes are strings so that a client can show an
// unknown one without a table; see docs/protocol.md section 8.
type Code string

// The error codes of protocol version 1.
const (
	CodeBadRequest   Code = "bad_request"    // malformed frame, request or argument
	CodeUnknownOp    Code = "unknown_op"     // no such op, or not an op of the object's kind
	CodeNoSuchObject Code = "no_such_object" // no object has that name
	CodeKindMismatch Code = "kind_mismatch"  // the name belongs to an object of another kind
	CodeBadName      Code = "bad_name"       // the name breaks the naming rules
	CodeNotOwner     Code = "not_owner"      // release of a lock the caller does not hold
	CodeValueError   Code = "value_error"    // an argument out of range
	CodeTypeError    Code = "type_error"     // an argument of the wrong type for the object
	CodeEmpty        Code = "empty"          // queue empty
	CodeFull         Code = "full"           // queue full
	CodeCancelled    Code = "cancelled"      // the request was cancelled
	CodeDeleted      Code = "deleted"        // the object was deleted while the request waited
	CodeShutdown     Code = "shutting_down"  // the daemon is stopping
	CodeTooLarge     Code = "too_large"      // a frame over the size limit
	CodeLimit        Code = "limit"          // a configured limit was reached
	CodeAuthFailed   Code = "auth_failed"    // handshake authentication failed
	CodeVersion      Code = "version"        // no common protocol version
	CodeBroken       Code = "broken"         // a barrier is broken
	// CodeServerRestarted: the request names state held under an earlier
	// run of the daemon (its "run" argument is not the daemon's run id).
	CodeServerRestarted Code = "server_restarted"
	CodeKeyError        Code = "key_error"   // a dict key that is not there
	CodeIndexError      Code = "index_error" // a list index out of range
	CodeExists          Code = "exists"      // a shared-memory segment of that name exists
	CodeNoSpace         Code = "no_space"    // the shared-memory filesystem is full
	CodeInternal        Code = "internal"    // a bug in the daemon
)

// Error is an error carried on the wire: a code and a human message.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Is reports whether target is a *Error with the same code, so that
// errors.Is(err, &wire.Error{Code: wire.CodeEmpty}) works.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// Errorf returns a *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Sentinel errors of the framing layer.
var (
	// ErrFrameTooLarge is returned when a frame header announces a body over
	// the reader's limit. The stream cannot be resynchronised after it.
	ErrFrameTooLarge = errors.New("frame too large")
	// ErrEmptyFrame is returned for a frame header announcing zero bytes.
	ErrEmptyFrame = errors.New("empty frame")
	// ErrMalformed is wrapped by every decoding error of a frame body.
	ErrMalformed = errors.New("malformed message")
)
