package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/syncmgr/syncmgr/wire"
)

// Version is the protocol version this package speaks.
const Version = 1

// NonceSize is the size of each side's challenge nonce.
const NonceSize = 32

// The role labels bound into each MAC. They differ, so a MAC made in one role
// is useless in the other (no reflection).
const (
	ClientLabel = "syncmgr/1 client"
	ServerLabel = "syncmgr/1 server"
)

// MaxLabel is the longest client label the server keeps.
const MaxLabel = 128

// ErrAuthFailed is returned when the peer did not prove knowledge of the key.
var ErrAuthFailed = errors.New("authentication failed")

// ErrNoKey is returned when an empty authkey is given.
var ErrNoKey = errors.New("empty authkey")

// Hello is the server's first message.
type Hello struct {
	T        string `msgpack:"t"`
	Versions []int  `msgpack:"versions"`
	Nonce    []byte `msgpack:"nonce"`
	MaxFrame uint32 `msgpack:"max_frame"`
	Server   string `msgpack:"server"`
	// Ready says the server reads an optional Ready frame before Auth.
	// A client that sent one to a server without it must reconnect
	// without it.
	Ready bool `msgpack:"ready,omitempty"`
}

// Ready is the frame a client sends as soon as it is connected, before it
// has read the server's Hello: the server then knows at once that the peer
// is a client at work, not an idle connection holding a slot (see the
// daemon's handshake budget).
type Ready struct {
	T string `msgpack:"t"`
}

// Auth is the client's answer to Hello.
type Auth struct {
	T       string `msgpack:"t"`
	Version int    `msgpack:"version"`
	Nonce   []byte `msgpack:"nonce"`
	MAC     []byte `msgpack:"mac"`
	Session []byte `msgpack:"session,omitempty"`
	PID     int    `msgpack:"pid,omitempty"`
	Label   string `msgpack:"label,omitempty"`
}

// Welcome is the server's answer to a valid Auth.
type Welcome struct {
	T       string `msgpack:"t"`
	MAC     []byte `msgpack:"mac"`
	Session []byte `msgpack:"session"`
	Conn    uint64 `msgpack:"conn"`
	BootID  string `msgpack:"boot_id"`
	PID     int    `msgpack:"pid"`
	// Run identifies this run of the daemon (random, new at each start);
	// clients older than it ignore it.
	Run string `msgpack:"run,omitempty"`
}

// ErrorMsg is the frame sent before closing a connection whose handshake
// failed.
type ErrorMsg struct {
	T       string `msgpack:"t"`
	Code    string `msgpack:"code"`
	Message string `msgpack:"message"`
	// RetryAfter, in seconds, tells a client refused with code limit when
	// trying again may succeed (0: not said).
	RetryAfter float64 `msgpack:"retry_after,omitempty"`
}

// MAC returns HMAC-SHA256(key, label || a || b).
func MAC(key []byte, label string, a, b []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	h.Write(a)
	h.Write(b)
	return h.Sum(nil)
}

// Nonce returns NonceSize random bytes.
func Nonce() ([]byte, error) {
	b := make([]byte, NonceSize)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("read random nonce: %w", err)
	}
	return b, nil
}

// ServerConfig says how the server side of a handshake answers.
type ServerConfig struct {
	Key      []byte
	MaxFrame uint32
	Server   string // informational name and version
	BootID   string
	PID      int
	ConnID   uint64
	RunID    string // this run of the daemon, sent in the welcome
	// Penalty, when set, is called when the client's MAC is wrong, before
	// the error frame is sent; it may block (the daemon slows down wrong
	// keys there, so that a right key never waits).
	Penalty func()
}

// Peer is what the server learns about an authenticated client.
type Peer struct {
	Version int
	Session []byte // nil when the client gave none
	PID     int
	Label   string
}

// HandshakeError is a handshake failure the server reports to the client
// before closing.
type HandshakeError struct {
	Code wire.Code
	Err  error
}

func (e *HandshakeError) Error() string { return "handshake: " + e.Err.Error() }
func (e *HandshakeError) Unwrap() error { return e.Err }

// Server runs the server side of the handshake on rw. The caller sets a
// deadline on the connection. On failure an error frame has been sent (when
// possible) and the caller should close the connection.
func Server(rw io.ReadWriter, cfg ServerConfig) (*Peer, error) {
	if len(cfg.Key) == 0 {
		return nil, ErrNoKey
	}
	ns, err := Nonce()
	if err != nil {
		return nil, err
	}
	if err := writeMsg(rw, Hello{T: "hello", Versions: []int{Version}, Nonce: ns, MaxFrame: cfg.MaxFrame, Server: cfg.Server, Ready: true}); err != nil {
		return nil, fmt.Errorf("write hello: %w", err)
	}
	fail := func(code wire.Code, err error) (*Peer, error) {
		_ = writeMsg(rw, ErrorMsg{T: "error", Code: string(code), Message: err.Error()})
		return nil, &HandshakeError{Code: code, Err: err}
	}
	body, err := wire.ReadFrame(rw, wire.HandshakeMaxFrame)
	if err != nil {
		switch {
		case errors.Is(err, wire.ErrFrameTooLarge):
			return fail(wire.CodeTooLarge, fmt.Errorf("auth frame: %w", err))
		case errors.Is(err, wire.ErrEmptyFrame):
			return fail(wire.CodeBadRequest, fmt.Errorf("auth frame: %w", err))
		}
		return nil, fmt.Errorf("read auth: %w", err)
	}
	var a Auth
	err = wire.Unmarshal(body, &a)
	if err == nil && a.T == "ready" { // the client spoke first; its auth follows
		if body, err = wire.ReadFrame(rw, wire.HandshakeMaxFrame); err != nil {
			return nil, fmt.Errorf("read auth: %w", err)
		}
		a = Auth{}
		err = wire.Unmarshal(body, &a)
	}
	if err != nil || a.T != "auth" {
		return fail(wire.CodeBadRequest, errors.New("expected an auth message"))
	}
	if a.Version != Version {
		return fail(wire.CodeVersion, fmt.Errorf("unsupported protocol version %d (server speaks %d)", a.Version, Version))
	}
	if len(a.Nonce) != NonceSize || len(a.Session) > 64 || len(a.Label) > MaxLabel {
		return fail(wire.CodeBadRequest, errors.New("malformed auth message"))
	}
	if !hmac.Equal(a.MAC, MAC(cfg.Key, ClientLabel, ns, a.Nonce)) {
		if cfg.Penalty != nil {
			cfg.Penalty()
		}
		return fail(wire.CodeAuthFailed, errors.New("authkey does not match the server's"))
	}
	w := Welcome{T: "welcome", MAC: MAC(cfg.Key, ServerLabel, a.Nonce, ns), Session: a.Session,
		Conn: cfg.ConnID, BootID: cfg.BootID, PID: cfg.PID, Run: cfg.RunID}
	if err := writeMsg(rw, w); err != nil {
		return nil, fmt.Errorf("write welcome: %w", err)
	}
	return &Peer{Version: a.Version, Session: a.Session, PID: a.PID, Label: a.Label}, nil
}

// ClientConfig says what a client presents in the handshake.
type ClientConfig struct {
	Key     []byte
	Session []byte
	PID     int
	Label   string
	// Ready sends a Ready frame before reading the server's Hello (the
	// caller's connection is new). A server whose Hello does not say it
	// reads one fails the handshake with ErrNoReady: reconnect without.
	Ready bool
}

// ErrNoReady is returned by Client when it sent a Ready frame to a server
// that does not read one (a daemon older than it): the connection is
// unusable; a new one without Ready works.
var ErrNoReady = errors.New("the server does not read a ready frame")

// ServerInfo is what a client learns about the server it authenticated.
type ServerInfo struct {
	Version  int
	Server   string
	MaxFrame uint32
	Session  []byte
	ConnID   uint64
	BootID   string
	PID      int
	RunID    string // "" from a daemon that sends none
}

// Client runs the client side of the handshake on rw. It fails with an error
// wrapping ErrAuthFailed when either side's proof is wrong, and with a
// *wire.Error for any other error the server reported.
func Client(rw io.ReadWriter, cfg ClientConfig) (*ServerInfo, error) {
	if len(cfg.Key) == 0 {
		return nil, ErrNoKey
	}
	if cfg.Ready {
		if err := writeMsg(rw, Ready{T: "ready"}); err != nil {
			return nil, fmt.Errorf("write ready: %w", err)
		}
	}
	body, err := wire.ReadFrame(rw, wire.HandshakeMaxFrame)
	if err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if err := refusal(body); err != nil { // refused before the challenge (e.g. peer credentials)
		return nil, err
	}
	var h Hello
	if err := wire.Unmarshal(body, &h); err != nil || h.T != "hello" || len(h.Nonce) != NonceSize {
		return nil, fmt.Errorf("read hello: %w", wire.ErrMalformed)
	}
	supported := false
	for _, v := range h.Versions {
		supported = supported || v == Version
	}
	if !supported {
		return nil, &wire.Error{Code: wire.CodeVersion, Message: fmt.Sprintf("server speaks versions %v, client %d", h.Versions, Version)}
	}
	if cfg.Ready && !h.Ready {
		return nil, ErrNoReady
	}
	nc, err := Nonce()
	if err != nil {
		return nil, err
	}
	a := Auth{T: "auth", Version: Version, Nonce: nc, MAC: MAC(cfg.Key, ClientLabel, h.Nonce, nc),
		Session: cfg.Session, PID: cfg.PID, Label: cfg.Label}
	if err := writeMsg(rw, a); err != nil {
		return nil, fmt.Errorf("write auth: %w", err)
	}
	body, err = wire.ReadFrame(rw, wire.HandshakeMaxFrame)
	if err != nil {
		return nil, fmt.Errorf("read welcome: %w", err)
	}
	if err := refusal(body); err != nil {
		return nil, err
	}
	var w Welcome
	if err := wire.Unmarshal(body, &w); err != nil || w.T != "welcome" {
		return nil, fmt.Errorf("read welcome: %w", wire.ErrMalformed)
	}
	if !hmac.Equal(w.MAC, MAC(cfg.Key, ServerLabel, nc, h.Nonce)) {
		return nil, fmt.Errorf("%w: the server did not prove it knows the key", ErrAuthFailed)
	}
	return &ServerInfo{Version: Version, Server: h.Server, MaxFrame: h.MaxFrame, Session: w.Session,
		ConnID: w.Conn, BootID: w.BootID, PID: w.PID, RunID: w.Run}, nil
}

// refusal returns the error an error frame carries, or nil for any other
// frame.
func refusal(body []byte) error {
	var em ErrorMsg
	if err := wire.Unmarshal(body, &em); err != nil || em.T != "error" {
		return nil
	}
	if em.Code == string(wire.CodeAuthFailed) {
		return fmt.Errorf("%w: server says: %s", ErrAuthFailed, em.Message)
	}
	return &RefusedError{Err: &wire.Error{Code: wire.Code(em.Code), Message: em.Message}, RetryAfter: time.Duration(em.RetryAfter * float64(time.Second))}
}

// RefusedError is a server's refusal in the handshake (an error frame
// other than auth_failed). It unwraps to the *wire.Error.
type RefusedError struct {
	Err        *wire.Error
	RetryAfter time.Duration // the server's hint; 0 when it gave none
}

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

func writeMsg(w io.Writer, v any) error {
	b, err := wire.Marshal(v)
	if err != nil {
		return err
	}
	return wire.WriteFrame(w, b)
}
