package proxy

import (
	"context"
	"errors"
	"fmt"
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
		return nil, ErrNoKey
	}
	label := fmt.Sprintf("%s[%d]", filepath.Base(os.Args[0]), os.Getpid())
	return Dial(ctx, DefaultAddress(), key, append([]Option{WithLabel(label)}, opts...)...)
}
