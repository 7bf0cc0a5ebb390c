package server

import (
	"context"
	"errors"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/shmregistry"
	"github.com/syncmgr/syncmgr/wire"
)

// errParked is returned by a handler whose reply will be sent later.
var errParked = errors.New("parked")

var codes = []struct {
	err  error
	code wire.Code
}{
	{manager.ErrNoSuchObject, wire.CodeNoSuchObject},
	{manager.ErrKindMismatch, wire.CodeKindMismatch},
	{manager.ErrBadName, wire.CodeBadName},
	{manager.ErrNotOwner, wire.CodeNotOwner},
	{manager.ErrValue, wire.CodeValueError},
	{manager.ErrType, wire.CodeTypeError},
	{manager.ErrEmpty, wire.CodeEmpty},
	{manager.ErrFull, wire.CodeFull},
	{manager.ErrDeleted, wire.CodeDeleted},
	{manager.ErrShutdown, wire.CodeShutdown},
	{manager.ErrLimit, wire.CodeLimit},
	{manager.ErrBroken, wire.CodeBroken},
	{manager.ErrIndex, wire.CodeIndexError},
	{manager.ErrKey, wire.CodeKeyError},
	{manager.ErrUnknownKind, wire.CodeBadRequest},
	{shmregistry.ErrExists, wire.CodeExists},
	{shmregistry.ErrNotFound, wire.CodeNoSuchObject},
	{shmregistry.ErrBadName, wire.CodeBadName},
	{shmregistry.ErrSize, wire.CodeValueError},
	{shmregistry.ErrLimit, wire.CodeLimit},
	{shmregistry.ErrNoSpace, wire.CodeNoSpace},
	{shmregistry.ErrClosed, wire.CodeShutdown},
	{context.Canceled, wire.CodeCancelled},
	{wire.ErrMalformed, wire.CodeBadRequest},
	{wire.ErrFrameTooLarge, wire.CodeTooLarge},
}

// toWire maps any error to the wire error sent to the client. This is the
// one place where Go errors become wire codes: the same mistake gets the
// same code from every op (an unknown kind is bad_request on create as on
// any other op; an unknown op is unknown_op).
func toWire(err error) *wire.Error {
	var we *wire.Error
	if errors.As(err, &we) {
		return we
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return &wire.Error{Code: c.code, Message: err.Error()}
		}
	}
	return &wire.Error{Code: wire.CodeInternal, Message: err.Error()}
}
