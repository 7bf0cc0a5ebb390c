package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// header returns a frame header announcing n bytes.
func header(n uint32) []byte {
	var h [HeaderSize]byte
	binary.BigEndian.PutUint32(h[:], n)
	return h[:]
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestFrameRoundTrip(t *testing.T) {
	for _, size := range []int{1, 2, 255, 4096, 65537, 1 << 20} {
		body := bytes.Repeat([]byte{0xa5}, size)
		body[0] = byte(size)
		var buf bytes.Buffer
		if err := WriteFrame(&buf, body); err != nil {
			t.Fatalf("size %d: write: %v", size, err)
		}
		if buf.Len() != HeaderSize+size {
			t.Fatalf("size %d: wrote %d bytes, want %d", size, buf.Len(), HeaderSize+size)
		}
		got, err := ReadFrame(&buf, uint32(size))
		if err != nil {
			t.Fatalf("size %d: read: %v", size, err)
		}
		if !bytes.Equal(got, body) {
			t.Fatalf("size %d: body differs", size)
		}
		if buf.Len() != 0 {
			t.Fatalf("size %d: %d bytes left unread", size, buf.Len())
		}
	}
}

func TestFrameSequence(t *testing.T) {
	var buf bytes.Buffer
	for i := 1; i <= 5; i++ {
		if err := WriteFrame(&buf, bytes.Repeat([]byte{byte(i)}, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 5; i++ {
		got, err := ReadFrame(&buf, 16)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{byte(i)}, i)) {
			t.Fatalf("frame %d: got %v", i, got)
		}
	}
	if _, err := ReadFrame(&buf, 16); err != io.EOF {
		t.Fatalf("after the last frame: got %v, want io.EOF", err)
	}
}

func TestReadFrameErrors(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		max     uint32
		want    error // matched with errors.Is
		maxRead int   // the reader must not consume more than this
	}{
		{"empty stream", nil, 16, io.EOF, 0},
		{"partial header", []byte{0, 0}, 16, io.ErrUnexpectedEOF, 2},
		{"zero length", header(0), 16, ErrEmptyFrame, HeaderSize},
		{"one over the limit", append(header(17), make([]byte, 17)...), 16, ErrFrameTooLarge, HeaderSize},
		{"4 GiB claimed", header(0xffffffff), DefaultMaxFrame, ErrFrameTooLarge, HeaderSize},
		{"handshake limit", append(header(HandshakeMaxFrame+1), make([]byte, 16)...), HandshakeMaxFrame, ErrFrameTooLarge, HeaderSize},
		{"truncated body", append(header(10), 1, 2, 3), 16, io.ErrUnexpectedEOF, HeaderSize + 3},
		{"header only", header(10), 16, io.ErrUnexpectedEOF, HeaderSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cr := &countingReader{r: bytes.NewReader(tt.in)}
			body, err := ReadFrame(cr, tt.max)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if body != nil {
				t.Fatalf("got a body of %d bytes with an error", len(body))
			}
			if cr.n > tt.maxRead {
				t.Fatalf("read %d bytes, want at most %d", cr.n, tt.maxRead)
			}
		})
	}
}

// TestReadFrameOverLimitDoesNotAllocate checks that the length is refused
// before anything is allocated for the body.
func TestReadFrameOverLimitDoesNotAllocate(t *testing.T) {
	hdr := header(0xffffffff)
	allocs := testing.AllocsPerRun(100, func() {
		_, err := ReadFrame(bytes.NewReader(hdr), DefaultMaxFrame)
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("got %v", err)
		}
	})
	// The bytes.Reader, the header array and the wrapped error allocate a
	// little; a body would be 4 GiB.
	if allocs > 8 {
		t.Fatalf("%v allocations for a refused frame", allocs)
	}
}

func TestFramed(t *testing.T) {
	buf := append(make([]byte, HeaderSize), "hello"...)
	Framed(buf)
	got, err := ReadFrame(bytes.NewReader(buf), 5)
	if err != nil || string(got) != "hello" {
		t.Fatalf("got %q, %v", got, err)
	}
}
