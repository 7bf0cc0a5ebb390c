package auth

import (
	"bytes"
	"crypto/hmac"
	"testing"

	"github.com/syncmgr/syncmgr/wire"
)

// scriptedConn is a ReadWriter that serves a fixed input and records the
// output, so the fuzz target needs no goroutines.
type scriptedConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *scriptedConn) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c *scriptedConn) Write(p []byte) (int, error) { return c.out.Write(p) }

func FuzzServerHandshake(f *testing.F) {
	nc := bytes.Repeat([]byte{3}, NonceSize)
	seeds := []any{
		Auth{T: "auth", Version: Version, Nonce: nc, MAC: make([]byte, 32)},
		Auth{T: "auth", Version: Version, Nonce: nc, MAC: make([]byte, 32), Session: []byte("s"), PID: 9, Label: "x"},
		Auth{T: "auth", Version: 2, Nonce: nc, MAC: make([]byte, 32)},
		Auth{T: "auth", Version: Version, Nonce: nc[:5]},
		map[string]any{"t": "auth", "version": "1", "nonce": nc},
		map[string]any{"t": "auth", "version": 1, "nonce": nc, "mac": "str"},
		map[string]any{"t": []any{1, 2}, "x": map[string]any{"y": nil}},
		[]any{"auth", 1},
		"auth",
		nil,
	}
	for _, s := range seeds {
		b, err := wire.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0xc1})
	f.Add([]byte{0x82, 0xa1, 't', 0xa4, 'a', 'u', 't', 'h', 0xa5, 'n', 'o', 'n', 'c', 'e', 0xc6, 0x7f, 0xff, 0xff, 0xff})
	f.Add(bytes.Repeat([]byte{0x91}, 4000))
	key := []byte("fuzz-key")
	f.Fuzz(func(t *testing.T, body []byte) {
		var in bytes.Buffer
		if len(body) > 0 {
			_ = wire.WriteFrame(&in, body)
		}
		conn := &scriptedConn{in: bytes.NewReader(in.Bytes())}
		peer, err := Server(conn, ServerConfig{Key: key, MaxFrame: 1 << 20})
		out := bytes.NewReader(conn.out.Bytes())
		helloBody, herr := wire.ReadFrame(out, wire.HandshakeMaxFrame)
		if herr != nil {
			t.Fatalf("no hello: %v", herr)
		}
		var h Hello
		if err := wire.Unmarshal(helloBody, &h); err != nil {
			t.Fatalf("bad hello: %v", err)
		}
		if err == nil {
			// Success is possible only with a valid MAC over this hello's
			// fresh nonce, which random input cannot hold.
			var a Auth
			if wire.Unmarshal(body, &a) != nil || !hmac.Equal(a.MAC, MAC(key, ClientLabel, h.Nonce, a.Nonce)) {
				t.Fatalf("handshake succeeded without a valid MAC: %+v", peer)
			}
			return
		}
		if peer != nil {
			t.Fatal("peer returned with an error")
		}
		if len(body) > wire.HandshakeMaxFrame {
			if code := handshakeCode(err); code != wire.CodeTooLarge {
				t.Fatalf("oversize auth: code %q, err %v", code, err)
			}
		}
		// Whatever the server answered is one well-formed error frame that
		// carries no key material.
		if rest := out.Len(); rest > 0 {
			eb, err := wire.ReadFrame(out, wire.HandshakeMaxFrame)
			if err != nil {
				t.Fatalf("bad error frame: %v", err)
			}
			var em ErrorMsg
			if err := wire.Unmarshal(eb, &em); err != nil || em.T != "error" || em.Code == "" {
				t.Fatalf("bad error frame %+v: %v", em, err)
			}
			if bytes.Contains(eb, key) {
				t.Fatal("error frame contains the key")
			}
			if out.Len() != 0 {
				t.Fatal("more than one frame after hello")
			}
		}
	})
}
