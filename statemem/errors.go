package statemem

import "errors"

var (
	// ErrFull means every object slot of the segment is in use; the object
	// then stays on the socket path.
	ErrFull = errors.New("statemem: segment full")
	// ErrBadSegment means a file is not a segment this package may map:
	// wrong owner, mode, size, type or header.
	ErrBadSegment = errors.New("statemem: not a usable segment")
	// ErrBigEndian means the host's byte order puts a word's low half at
	// the wrong address for the futex; the fast path is little-endian only.
	ErrBigEndian = errors.New("statemem: big-endian host")
)
