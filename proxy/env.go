package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/syncmgr/syncmgr/auth"
)

// EnvAddress is the environment variable holding the daemon's address (a
// socket path or tcp://host:port), as the Python client reads it.
const EnvAddress = "SYNCMGR_ADDRESS"

// ErrNoKey is returned by DialEnv when neither $SYNCMGR_AUTHKEY nor
// $SYNCMGR_AUTHKEY_FILE is set.
var ErrNoKey = errors.New("no syncmgr authkey: set " + auth.EnvKey + " (hex) or " + auth.EnvKeyFile +
	" in this process's environment (make a key with `syncmgr keygen`)")

// DefaultAddress is the address DialEnv uses when $SYNCMGR_ADDRESS is unset:
// the daemon's default socket, $XDG_RUNTIME_DIR/syncmgr.sock or else
// $TMPDIR/syncmgr-<uid>/syncmgr.sock.
func DefaultAddress() string {
	if a := os.Getenv(EnvAddress); a != "" {
		return a
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "syncmgr.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("syncmgr-%d", os.Getuid()), "syncmgr.sock")
}

// DialEnv connects to the daemon named by the environment, as a Python
// process with the same variables would: the address from $SYNCMGR_ADDRESS
// (else DefaultAddress), the key from $SYNCMGR_AUTHKEY (hex), else from the
// file named by $SYNCMGR_AUTHKEY_FILE. The label shown by `syncmgr status`
// defaults to the program's name and pid; opts (WithTLS, WithLabel, ...)
// apply after the defaults.
func DialEnv(ctx context.Context, opts ...Option) (*Client, error) {
	key, found, err := auth.LoadKey("")
	if err != nil {
		return nil, err
	}
	if !found {
		// No daemon there is the first thing to fix: say that before the key.
		network, addr := ParseAddress(DefaultAddress())
		var d net.Dialer
		nc, derr := d.DialContext(ctx, network, addr)
		if nd := noDaemon(DefaultAddress(), derr); nd != nil {
			return nil, fmt.Errorf("%w; and no authkey is set either", nd)
		}
		if nc != nil {
			nc.Close()
		}
		return nil, ErrNoKey
	}
	label := fmt.Sprintf("%s[%d]", filepath.Base(os.Args[0]), os.Getpid())
	defaults := []Option{WithLabel(label)}
	tcfg, err := TLSFromEnv()
	if err != nil {
		return nil, err
	}
	if tcfg != nil {
		defaults = append(defaults, WithTLS(tcfg))
	}
	c, err := Dial(ctx, DefaultAddress(), key, append(defaults, opts...)...)
	if errors.Is(err, auth.ErrAuthFailed) {
		return nil, fmt.Errorf("%w (the key came from %s)", err, auth.KeySource(""))
	}
	return c, err
}

// The TLS variables, the same the Python client reads (and
// Manager.runtime_env passes to Ray workers).
const (
	EnvTLSCA         = "SYNCMGR_TLS_CA"          // CA file (PEM) to trust; setting it turns TLS on
	EnvTLSCert       = "SYNCMGR_TLS_CERT"        // client certificate (PEM), optional
	EnvTLSKey        = "SYNCMGR_TLS_KEY"         // its private key (PEM)
	EnvTLSServerName = "SYNCMGR_TLS_SERVER_NAME" // name to check the server's certificate against
)

// TLSFromEnv builds the TLS configuration the environment asks for, or nil
// when $SYNCMGR_TLS_CA is unset (plain connections).
func TLSFromEnv() (*tls.Config, error) {
	ca := os.Getenv(EnvTLSCA)
	if ca == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("syncmgr: read %s=%s: %w", EnvTLSCA, ca, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("syncmgr: %s=%s holds no PEM certificate", EnvTLSCA, ca)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, ServerName: os.Getenv(EnvTLSServerName)}
	certFile, keyFile := os.Getenv(EnvTLSCert), os.Getenv(EnvTLSKey)
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("syncmgr: load %s/%s: %w", EnvTLSCert, EnvTLSKey, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
