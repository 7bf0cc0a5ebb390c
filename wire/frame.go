package wire

import (
	"encoding/binary"
	"fmt"
	"io"
)

// HeaderSize is the size of a frame header: a big-endian uint32 body length.
const HeaderSize = 4

// DefaultMaxFrame is the default largest frame body accepted after the
// handshake.
const DefaultMaxFrame = 64 << 20

// HandshakeMaxFrame is the largest frame body accepted before the handshake
// has completed.
const HandshakeMaxFrame = 4 << 10

// ReadFrame reads one frame from r and returns its body. The length is
// checked against max before anything is allocated, so a peer that claims a
// 4 GiB frame costs nothing. A returned ErrFrameTooLarge leaves the body
// unread (a reader that wants to go on skips it, as the daemon does); after
// ErrEmptyFrame the stream is unusable.
func ReadFrame(r io.Reader, max uint32) ([]byte, error) {
	n, err := ReadHeader(r)
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
	}
	return ReadBody(r, n)
}

// ReadHeader reads a frame header and returns the body length, which is
// never 0 (ErrEmptyFrame).
func ReadHeader(r io.Reader) (uint32, error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 {
		return 0, ErrEmptyFrame
	}
	return n, nil
}

// ReadBody reads a frame body of n bytes; the caller has checked n against
// its limit. It allocates n bytes at once: for a peer that is trusted not to
// announce what it does not send (the daemon, to its clients).
func ReadBody(r io.Reader, n uint32) ([]byte, error) {
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read frame body: %w", err)
	}
	return body, nil
}

// ReadBodyAsItArrives is ReadBody for untrusted peers: memory follows the
// bytes that arrive, not the declared length, so a header announcing 64 MiB
// followed by silence costs 1 MiB, not 64. The buffer doubles as it fills,
// and takes the whole length at once when that is at most a quarter more
// than the next size: a body of a power-of-two item and its envelope (1 MiB
// and a few bytes) is read with no copy, not into 1 MiB grown by a copy.
// (The price of a larger body is a few copies while it grows.)
func ReadBodyAsItArrives(r io.Reader, n uint32) ([]byte, error) {
	const step = 1 << 20
	body := make([]byte, bodyStep(step, n))
	got := 0
	for {
		m, err := io.ReadFull(r, body[got:])
		got += m
		if err != nil || got == int(n) {
			if err == nil {
				return body, nil
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("read frame body: %w", err)
		}
		grown := make([]byte, bodyStep(2*len(body), n))
		copy(grown, body)
		body = grown
	}
}

// bodyStep is the next buffer size for a body of n bytes: size, or n when n
// is at most a quarter more.
func bodyStep(size int, n uint32) int {
	if int(n) <= size+size/4 {
		return int(n)
	}
	return size
}

// WriteFrame writes body as one frame with a single Write call.
func WriteFrame(w io.Writer, body []byte) error {
	buf := make([]byte, HeaderSize+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[HeaderSize:], body)
	_, err := w.Write(buf)
	return err
}

// Framed returns buf with its first HeaderSize bytes set to the length of the
// rest. Encoders in this package leave room for the header so that a message
// is built and sent without a second copy.
func Framed(buf []byte) []byte {
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-HeaderSize))
	return buf
}
