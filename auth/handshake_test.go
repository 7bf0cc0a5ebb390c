package auth

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/wire"
)

var (
	testKey  = []byte("0123456789abcdef0123456789abcdef")
	otherKey = []byte("fedcba9876543210fedcba9876543210")
)

func serverConfig(key []byte) ServerConfig {
	return ServerConfig{Key: key, MaxFrame: 1 << 20, Server: "syncmgr test", BootID: "boot-1", PID: 42, ConnID: 7}
}

// pipe returns both ends of a net.Pipe with a deadline, closed at cleanup.
func pipe(t *testing.T) (client, server net.Conn) {
	t.Helper()
	client, server = net.Pipe()
	dl := time.Now().Add(5 * time.Second)
	_ = client.SetDeadline(dl)
	_ = server.SetDeadline(dl)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

type serverResult struct {
	peer *Peer
	err  error
}

// runServer runs Server on conn in a goroutine; the channel gets its result.
// The connection is closed when Server returns, as the daemon does.
func runServer(conn net.Conn, cfg ServerConfig) <-chan serverResult {
	ch := make(chan serverResult, 1)
	go func() {
		p, err := Server(conn, cfg)
		if err != nil {
			conn.Close()
		}
		ch <- serverResult{p, err}
	}()
	return ch
}

func wait[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

func handshakeCode(err error) wire.Code {
	var he *HandshakeError
	if errors.As(err, &he) {
		return he.Code
	}
	return ""
}

func TestHandshakeSuccess(t *testing.T) {
	for _, session := range [][]byte{nil, []byte("sess-0123456789"), bytes.Repeat([]byte{7}, 64)} {
		t.Run(fmt.Sprintf("session=%d", len(session)), func(t *testing.T) {
			cc, sc := pipe(t)
			res := runServer(sc, serverConfig(testKey))
			info, err := Client(cc, ClientConfig{Key: testKey, Session: session, PID: 1234, Label: "go test"})
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			r := wait(t, res)
			if r.err != nil {
				t.Fatalf("server: %v", r.err)
			}
			if r.peer.Version != Version || !bytes.Equal(r.peer.Session, session) || r.peer.PID != 1234 || r.peer.Label != "go test" {
				t.Fatalf("peer: %+v", r.peer)
			}
			want := ServerInfo{Version: Version, Server: "syncmgr test", MaxFrame: 1 << 20, Session: session, ConnID: 7, BootID: "boot-1", PID: 42}
			if fmt.Sprint(*info) != fmt.Sprint(want) {
				t.Fatalf("info:\n got %+v\nwant %+v", *info, want)
			}
		})
	}
}

func TestHandshakeWrongKey(t *testing.T) {
	cc, sc := pipe(t)
	res := runServer(sc, serverConfig(testKey))
	_, err := Client(cc, ClientConfig{Key: otherKey})
	if !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("client: got %v, want ErrAuthFailed", err)
	}
	r := wait(t, res)
	if handshakeCode(r.err) != wire.CodeAuthFailed || r.peer != nil {
		t.Fatalf("server: got %v, want an auth_failed HandshakeError", r.err)
	}
	for _, k := range [][]byte{testKey, otherKey} {
		if strings.Contains(err.Error(), string(k)) || strings.Contains(r.err.Error(), string(k)) {
			t.Fatal("an error message contains key material")
		}
	}
}

// rawClient speaks the client side by hand on conn.
type rawClient struct {
	t     *testing.T
	conn  net.Conn
	hello Hello
}

func newRawClient(t *testing.T, conn net.Conn) *rawClient {
	t.Helper()
	body, err := wire.ReadFrame(conn, wire.HandshakeMaxFrame)
	if err != nil {
		t.Fatalf("read hello: %v", err)
	}
	rc := &rawClient{t: t, conn: conn}
	if err := wire.Unmarshal(body, &rc.hello); err != nil {
		t.Fatalf("decode hello: %v", err)
	}
	if rc.hello.T != "hello" || len(rc.hello.Nonce) != NonceSize || len(rc.hello.Versions) == 0 {
		t.Fatalf("bad hello %+v", rc.hello)
	}
	return rc
}

func (rc *rawClient) send(v any) {
	rc.t.Helper()
	b, err := wire.Marshal(v)
	if err != nil {
		rc.t.Fatal(err)
	}
	rc.sendRaw(b)
}

func (rc *rawClient) sendRaw(body []byte) {
	rc.t.Helper()
	if err := wire.WriteFrame(rc.conn, body); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// answer reads the server's answer: an error code, or "" for a welcome.
func (rc *rawClient) answer() (code string, w Welcome) {
	rc.t.Helper()
	body, err := wire.ReadFrame(rc.conn, wire.HandshakeMaxFrame)
	if err != nil {
		rc.t.Fatalf("read answer: %v", err)
	}
	var em ErrorMsg
	if err := wire.Unmarshal(body, &em); err != nil {
		rc.t.Fatalf("decode answer: %v", err)
	}
	if em.T == "error" {
		if em.Code == "" || em.Message == "" {
			rc.t.Fatalf("error frame without code or message: %+v", em)
		}
		return em.Code, w
	}
	if err := wire.Unmarshal(body, &w); err != nil || w.T != "welcome" {
		rc.t.Fatalf("answer is neither error nor welcome: %v", err)
	}
	return "", w
}

func (rc *rawClient) validAuth(key []byte) Auth {
	nc := bytes.Repeat([]byte{0x5c}, NonceSize)
	return Auth{T: "auth", Version: Version, Nonce: nc, MAC: MAC(key, ClientLabel, rc.hello.Nonce, nc)}
}

func TestHandshakeServerRefuses(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(rc *rawClient, a *Auth)
		raw    []byte // sent instead of the Auth when not nil
		code   wire.Code
	}{
		{"valid", func(*rawClient, *Auth) {}, nil, ""},
		{"wrong key", func(rc *rawClient, a *Auth) { a.MAC = MAC(otherKey, ClientLabel, rc.hello.Nonce, a.Nonce) }, nil, wire.CodeAuthFailed},
		{"no mac", func(rc *rawClient, a *Auth) { a.MAC = nil }, nil, wire.CodeAuthFailed},
		{"short mac", func(rc *rawClient, a *Auth) { a.MAC = a.MAC[:16] }, nil, wire.CodeAuthFailed},
		{"long mac", func(rc *rawClient, a *Auth) { a.MAC = append(a.MAC, 0) }, nil, wire.CodeAuthFailed},
		{"flipped bit", func(rc *rawClient, a *Auth) { a.MAC[31] ^= 1 }, nil, wire.CodeAuthFailed},
		{"server label", func(rc *rawClient, a *Auth) { a.MAC = MAC(testKey, ServerLabel, rc.hello.Nonce, a.Nonce) }, nil, wire.CodeAuthFailed},
		{"nonces swapped", func(rc *rawClient, a *Auth) { a.MAC = MAC(testKey, ClientLabel, a.Nonce, rc.hello.Nonce) }, nil, wire.CodeAuthFailed},
		{"echo the server nonce", func(rc *rawClient, a *Auth) {
			a.Nonce = rc.hello.Nonce
			a.MAC = MAC(otherKey, ClientLabel, rc.hello.Nonce, a.Nonce)
		}, nil, wire.CodeAuthFailed},
		{"version 2", func(rc *rawClient, a *Auth) { a.Version = 2 }, nil, wire.CodeVersion},
		{"version 0", func(rc *rawClient, a *Auth) { a.Version = 0 }, nil, wire.CodeVersion},
		{"short nonce", func(rc *rawClient, a *Auth) { a.Nonce = a.Nonce[:31] }, nil, wire.CodeBadRequest},
		{"no nonce", func(rc *rawClient, a *Auth) { a.Nonce = nil }, nil, wire.CodeBadRequest},
		{"session of 65 bytes", func(rc *rawClient, a *Auth) { a.Session = make([]byte, 65) }, nil, wire.CodeBadRequest},
		{"label too long", func(rc *rawClient, a *Auth) { a.Label = strings.Repeat("x", MaxLabel+1) }, nil, wire.CodeBadRequest},
		{"wrong type tag", func(rc *rawClient, a *Auth) { a.T = "hello" }, nil, wire.CodeBadRequest},
		{"garbage", nil, []byte("GET / HTTP/1.1\r\n\r\n"), wire.CodeBadRequest},
		{"reserved byte", nil, []byte{0xc1}, wire.CodeBadRequest},
		{"msgpack nil", nil, []byte{0xc0}, wire.CodeBadRequest},
		{"array instead of map", nil, []byte{0x93, 1, 2, 3}, wire.CodeBadRequest},
		{"nonce of wrong type", nil, func() []byte {
			b, _ := wire.Marshal(map[string]any{"t": "auth", "version": 1, "nonce": "not bin", "mac": []byte{1}})
			return b
		}(), wire.CodeBadRequest},
		{"bin32 claiming 2 GiB", nil, []byte{0x82, 0xa1, 't', 0xa4, 'a', 'u', 't', 'h', 0xa5, 'n', 'o', 'n', 'c', 'e', 0xc6, 0x7f, 0xff, 0xff, 0xff}, wire.CodeBadRequest},
		{"trailing bytes", nil, func() []byte {
			b, _ := wire.Marshal(map[string]any{"t": "auth"})
			return append(b, 0xc0)
		}(), wire.CodeBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, sc := pipe(t)
			res := runServer(sc, serverConfig(testKey))
			rc := newRawClient(t, cc)
			if tt.raw != nil {
				rc.sendRaw(tt.raw)
			} else {
				a := rc.validAuth(testKey)
				tt.mutate(rc, &a)
				rc.send(a)
			}
			code, w := rc.answer()
			r := wait(t, res)
			if code != string(tt.code) {
				t.Fatalf("answer %q, want %q", code, tt.code)
			}
			if tt.code == "" {
				if r.err != nil {
					t.Fatalf("server: %v", r.err)
				}
				a := rc.validAuth(testKey)
				if !bytes.Equal(w.MAC, MAC(testKey, ServerLabel, a.Nonce, rc.hello.Nonce)) {
					t.Fatal("welcome carries a wrong MAC")
				}
				return
			}
			if r.peer != nil || handshakeCode(r.err) != tt.code {
				t.Fatalf("server returned %+v, %v", r.peer, r.err)
			}
			if _, err := cc.Read(make([]byte, 1)); err == nil {
				t.Fatal("server did not close after a failed handshake")
			}
		})
	}
}

func TestHandshakeBadFrames(t *testing.T) {
	hdr := func(n uint32) []byte {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], n)
		return b[:]
	}
	tests := []struct {
		name string
		send []byte
		code wire.Code // "" when the server just drops the connection
	}{
		{"oversize", append(hdr(wire.HandshakeMaxFrame+1), make([]byte, 64)...), wire.CodeTooLarge},
		{"4 GiB", hdr(0xffffffff), wire.CodeTooLarge},
		{"empty frame", hdr(0), wire.CodeBadRequest},
		{"truncated body", append(hdr(100), 1, 2, 3), ""},
		{"truncated header", []byte{0, 0}, ""},
		{"nothing", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, sc := pipe(t)
			res := runServer(sc, serverConfig(testKey))
			newRawClient(t, cc)
			if len(tt.send) > 0 {
				// net.Pipe does not buffer: write while the answer is read.
				go func() { _, _ = cc.Write(tt.send) }()
			}
			if tt.code == "" {
				cc.Close() // the peer goes away mid-message
				r := wait(t, res)
				if r.err == nil || r.peer != nil {
					t.Fatalf("server: %+v %v", r.peer, r.err)
				}
				return
			}
			body, err := wire.ReadFrame(cc, wire.HandshakeMaxFrame)
			if err != nil {
				t.Fatalf("read answer: %v", err)
			}
			var em ErrorMsg
			if err := wire.Unmarshal(body, &em); err != nil || em.T != "error" || em.Code != string(tt.code) {
				t.Fatalf("answer %+v %v, want error %s", em, err, tt.code)
			}
			if r := wait(t, res); handshakeCode(r.err) != tt.code {
				t.Fatalf("server: %v", r.err)
			}
		})
	}
}

func TestHandshakeSlowClientTimesOut(t *testing.T) {
	cc, sc := pipe(t)
	_ = sc.SetDeadline(time.Now().Add(100 * time.Millisecond)) // the daemon's handshake deadline
	res := runServer(sc, serverConfig(testKey))
	newRawClient(t, cc) // and then say nothing
	r := wait(t, res)
	var ne net.Error
	if !errors.As(r.err, &ne) || !ne.Timeout() {
		t.Fatalf("got %v, want a timeout", r.err)
	}
}

// fakeServer runs a server that does not know the key: it sends hello, reads
// the client's auth, and answers with welcome built by answer.
func fakeServer(t *testing.T, conn net.Conn, versions []int, answer func(hello Hello, a Auth) any) {
	t.Helper()
	go func() {
		ns := bytes.Repeat([]byte{0x11}, NonceSize)
		h := Hello{T: "hello", Versions: versions, Nonce: ns, MaxFrame: 1 << 20, Server: "fake"}
		if writeMsg(conn, h) != nil {
			return
		}
		body, err := wire.ReadFrame(conn, wire.HandshakeMaxFrame)
		if err != nil {
			return
		}
		var a Auth
		if wire.Unmarshal(body, &a) != nil {
			return
		}
		_ = writeMsg(conn, answer(h, a))
	}()
}

func TestClientDetectsFakeServer(t *testing.T) {
	tests := []struct {
		name   string
		answer func(h Hello, a Auth) any
	}{
		{"random mac", func(h Hello, a Auth) any {
			return Welcome{T: "welcome", MAC: bytes.Repeat([]byte{9}, 32)}
		}},
		{"no mac", func(h Hello, a Auth) any { return Welcome{T: "welcome"} }},
		{"other key", func(h Hello, a Auth) any {
			return Welcome{T: "welcome", MAC: MAC(otherKey, ServerLabel, a.Nonce, h.Nonce)}
		}},
		{"reflects the client's mac", func(h Hello, a Auth) any { return Welcome{T: "welcome", MAC: a.MAC} }},
		{"client label, right key material unavailable", func(h Hello, a Auth) any {
			return Welcome{T: "welcome", MAC: MAC(otherKey, ClientLabel, h.Nonce, a.Nonce)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, sc := pipe(t)
			fakeServer(t, sc, []int{Version}, tt.answer)
			if _, err := Client(cc, ClientConfig{Key: testKey}); !errors.Is(err, ErrAuthFailed) {
				t.Fatalf("got %v, want ErrAuthFailed", err)
			}
		})
	}
}

func TestClientServerErrors(t *testing.T) {
	cc, sc := pipe(t)
	fakeServer(t, sc, []int{Version}, func(Hello, Auth) any {
		return ErrorMsg{T: "error", Code: string(wire.CodeLimit), Message: "too many connections"}
	})
	_, err := Client(cc, ClientConfig{Key: testKey})
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeLimit {
		t.Fatalf("got %v, want a limit wire error", err)
	}

	cc, sc = pipe(t)
	fakeServer(t, sc, []int{Version}, func(Hello, Auth) any { return map[string]any{"t": "surprise"} })
	if _, err := Client(cc, ClientConfig{Key: testKey}); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("unknown answer: got %v", err)
	}
}

func TestVersionMismatch(t *testing.T) {
	// The server speaks only a version this client does not.
	cc, sc := pipe(t)
	fakeServer(t, sc, []int{2, 3}, func(Hello, Auth) any { return nil })
	_, err := Client(cc, ClientConfig{Key: testKey})
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeVersion {
		t.Fatalf("got %v, want a version error", err)
	}
	// A server offering several versions including ours is fine as far as
	// the version goes (this fake one then fails the MAC).
	cc, sc = pipe(t)
	fakeServer(t, sc, []int{3, Version}, func(Hello, Auth) any { return Welcome{T: "welcome"} })
	if _, err := Client(cc, ClientConfig{Key: testKey}); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("got %v, want ErrAuthFailed", err)
	}
}

func TestClientRefusesBadHello(t *testing.T) {
	hellos := map[string]any{
		"short nonce": Hello{T: "hello", Versions: []int{1}, Nonce: make([]byte, 8)},
		"wrong tag":   Hello{T: "welcome", Versions: []int{1}, Nonce: make([]byte, 32)},
		"not a map":   []int{1, 2, 3},
	}
	for name, h := range hellos {
		t.Run(name, func(t *testing.T) {
			cc, sc := pipe(t)
			go func() { _ = writeMsg(sc, h) }()
			if _, err := Client(cc, ClientConfig{Key: testKey}); !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
		})
	}
	t.Run("oversize hello", func(t *testing.T) {
		cc, sc := pipe(t)
		go func() { _, _ = sc.Write([]byte{0xff, 0xff, 0xff, 0xff}) }()
		if _, err := Client(cc, ClientConfig{Key: testKey}); !errors.Is(err, wire.ErrFrameTooLarge) {
			t.Fatalf("got %v, want ErrFrameTooLarge", err)
		}
	})
}

// TestReflection: MACs seen in one handshake are useless in another, and a
// server's proof cannot be fed back to it as a client's.
func TestReflection(t *testing.T) {
	// A legitimate handshake, observed by the attacker.
	cc, sc := pipe(t)
	res := runServer(sc, serverConfig(testKey))
	rc := newRawClient(t, cc)
	legit := rc.validAuth(testKey)
	rc.send(legit)
	if code, _ := rc.answer(); code != "" {
		t.Fatalf("legitimate handshake failed: %s", code)
	}
	if r := wait(t, res); r.err != nil {
		t.Fatal(r.err)
	}
	serverMAC := MAC(testKey, ServerLabel, legit.Nonce, rc.hello.Nonce) // as sent in the welcome

	attempts := map[string]func(h Hello) Auth{
		"replay the client's auth": func(Hello) Auth { return legit },
		"feed the server's mac back": func(Hello) Auth {
			return Auth{T: "auth", Version: Version, Nonce: legit.Nonce, MAC: serverMAC}
		},
		"server's mac with its old nonce as ours": func(Hello) Auth {
			return Auth{T: "auth", Version: Version, Nonce: rc.hello.Nonce, MAC: serverMAC}
		},
		"server's mac, our nonce set to the new server nonce": func(h Hello) Auth {
			return Auth{T: "auth", Version: Version, Nonce: h.Nonce, MAC: serverMAC}
		},
	}
	for name, attempt := range attempts {
		t.Run(name, func(t *testing.T) {
			cc, sc := pipe(t)
			res := runServer(sc, serverConfig(testKey))
			rc2 := newRawClient(t, cc)
			if bytes.Equal(rc2.hello.Nonce, rc.hello.Nonce) {
				t.Fatal("the server reused a nonce")
			}
			rc2.send(attempt(rc2.hello))
			if code, _ := rc2.answer(); code != string(wire.CodeAuthFailed) {
				t.Fatalf("answer %q, want auth_failed", code)
			}
			if r := wait(t, res); r.err == nil {
				t.Fatal("server accepted")
			}
		})
	}
}

func TestEmptyKey(t *testing.T) {
	if _, err := Server(&bytes.Buffer{}, ServerConfig{}); !errors.Is(err, ErrNoKey) {
		t.Fatalf("server: %v", err)
	}
	if _, err := Client(&bytes.Buffer{}, ClientConfig{}); !errors.Is(err, ErrNoKey) {
		t.Fatalf("client: %v", err)
	}
}

func TestMACAndNonce(t *testing.T) {
	a, b := []byte("a"), []byte("b")
	if bytes.Equal(MAC(testKey, ClientLabel, a, b), MAC(testKey, ServerLabel, a, b)) {
		t.Fatal("labels do not separate the MACs")
	}
	if bytes.Equal(MAC(testKey, ClientLabel, a, b), MAC(otherKey, ClientLabel, a, b)) {
		t.Fatal("keys do not separate the MACs")
	}
	if len(MAC(testKey, ClientLabel, a, b)) != 32 {
		t.Fatal("MAC is not 32 bytes")
	}
	n1, err1 := Nonce()
	n2, err2 := Nonce()
	if err1 != nil || err2 != nil || len(n1) != NonceSize || bytes.Equal(n1, n2) {
		t.Fatal("nonces are not fresh 32-byte values")
	}
}

// failingWriter fails every write, for the hello path.
type failingRW struct{ io.Reader }

func (failingRW) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestServerWriteFails(t *testing.T) {
	_, err := Server(failingRW{bytes.NewReader(nil)}, serverConfig(testKey))
	if err == nil || !strings.Contains(err.Error(), "write hello") {
		t.Fatalf("got %v", err)
	}
}
