package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ErrTLSPin: the TLS certificate of the server is not the pinned one.
var ErrTLSPin = errors.New("syncmgr: the server's TLS certificate does not match the pinned fingerprint")

// WithTLSPin wraps TCP connections in TLS and accepts the server only if
// the SHA-256 of its certificate (DER) is sha256hex: 64 hex digits, as a
// daemon started with --tls-self-signed logs (tls_sha256) and writes to its
// --info-file; colons between bytes and upper case are accepted. No CA or
// host name is checked: the pin is the whole check. A malformed pin fails
// every dial. It replaces any WithTLS given before it.
func WithTLSPin(sha256hex string) Option {
	want, err := hex.DecodeString(strings.ReplaceAll(strings.ToLower(strings.TrimSpace(sha256hex)), ":", ""))
	if err == nil && len(want) != sha256.Size {
		err = fmt.Errorf("%d bytes, want %d", len(want), sha256.Size)
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // the pin below replaces the CA check
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err != nil {
				return fmt.Errorf("syncmgr: bad TLS pin %q: %w", sha256hex, err)
			}
			if len(cs.PeerCertificates) == 0 {
				return ErrTLSPin
			}
			got := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if subtle.ConstantTimeCompare(got[:], want) != 1 {
				return fmt.Errorf("%w (got %s)", ErrTLSPin, hex.EncodeToString(got[:]))
			}
			return nil
		},
	}
	return WithTLS(cfg)
}
