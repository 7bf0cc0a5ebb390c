package manager

import "errors"

// Sentinel errors. The transport maps each to a wire code in one place.
var (
	// ErrNoSuchObject: no object has the name.
	ErrNoSuchObject = errors.New("no such object")
	// ErrKindMismatch: the name belongs to an object of another kind.
	ErrKindMismatch = errors.New("kind mismatch")
	// ErrBadName: the name breaks the naming rules.
	ErrBadName = errors.New("bad name")
	// ErrNotOwner: releasing a lock that is not held (by the caller, for an RLock).
	ErrNotOwner = errors.New("not owner")
	// ErrValue: an argument out of range.
	ErrValue = errors.New("value error")
	// ErrType: a value of the wrong type for the object.
	ErrType = errors.New("type error")
	// ErrEmpty: the queue is empty.
	ErrEmpty = errors.New("queue empty")
	// ErrFull: the queue is full.
	ErrFull = errors.New("queue full")
	// ErrDeleted: the object was deleted while the caller waited on it.
	ErrDeleted = errors.New("object deleted")
	// ErrShutdown: the manager is shutting down.
	ErrShutdown = errors.New("server shutting down")
	// ErrLimit: a configured limit was reached.
	ErrLimit = errors.New("limit reached")
	// ErrIndex: a list index out of range.
	ErrIndex = errors.New("index error")
	// ErrKey: a dict key that is not there.
	ErrKey = errors.New("key error")
	// ErrUnknownKind: a kind that is not one of the 13 (a protocol error,
	// like an unknown op, on create and on every other op alike).
	ErrUnknownKind = errors.New("unknown kind")
	// ErrBroken: a barrier is broken.
	ErrBroken = errors.New("broken barrier")
)
