package auth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// EnvKey is the environment variable holding the authkey as hex.
const EnvKey = "SYNCMGR_AUTHKEY"

// EnvKeyFile is the environment variable naming a file holding the key as hex.
const EnvKeyFile = "SYNCMGR_AUTHKEY_FILE"

// KeySize is the size of keys made by NewKey.
const KeySize = 32

// ErrBadKey is returned for a key that is not valid hex. The message never
// includes the key itself.
var ErrBadKey = errors.New("authkey must be non-empty hex (make one with `syncmgr keygen`)")

// NewKey returns KeySize random bytes.
func NewKey() ([]byte, error) {
	k := make([]byte, KeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("read random key: %w", err)
	}
	return k, nil
}

// ParseKey decodes a hex key, ignoring surrounding white space.
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, ErrBadKey
	}
	k, err := hex.DecodeString(s)
	if err != nil {
		return nil, ErrBadKey
	}
	return k, nil
}

// ReadKeyFile reads a hex key from a file.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read authkey file: %w", err)
	}
	k, err := ParseKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("authkey file %s: %w", path, err)
	}
	return k, nil
}

// LoadKey finds the authkey: the file if one is named, else $SYNCMGR_AUTHKEY,
// else the file named by $SYNCMGR_AUTHKEY_FILE. found is false when none is
// set.
func LoadKey(file string) (key []byte, found bool, err error) {
	if file != "" {
		k, err := ReadKeyFile(file)
		return k, true, err
	}
	if s, ok := os.LookupEnv(EnvKey); ok {
		k, err := ParseKey(s)
		if err != nil {
			return nil, true, fmt.Errorf("$%s: %w", EnvKey, err)
		}
		return k, true, nil
	}
	if f := os.Getenv(EnvKeyFile); f != "" {
		k, err := ReadKeyFile(f)
		return k, true, err
	}
	return nil, false, nil
}

// MinKeySize is the shortest authkey the daemon accepts: 128 bits, so the
// key cannot be guessed online (see also the server's back-off after failed
// handshakes).
const MinKeySize = 16

// ErrWeakKey is returned by CheckKey for a key shorter than MinKeySize.
var ErrWeakKey = fmt.Errorf("authkey too short: at least %d bytes (%d hex digits) are needed; make one with `syncmgr keygen`", MinKeySize, 2*MinKeySize)

// CheckKey refuses a key shorter than MinKeySize. The error never includes
// the key.
func CheckKey(k []byte) error {
	if len(k) < MinKeySize {
		return fmt.Errorf("%w (got %d bytes)", ErrWeakKey, len(k))
	}
	return nil
}

// KeyFile returns the file LoadKey(file) reads the key from, or "" when the
// key comes from the environment or is not set.
func KeyFile(file string) string {
	if file != "" {
		return file
	}
	if _, ok := os.LookupEnv(EnvKey); ok {
		return ""
	}
	return os.Getenv(EnvKeyFile)
}

// KeySource says in words where LoadKey(file) takes the key from, for
// errors about a key the daemon refused: with both variables set, it names
// the one used and the one ignored.
func KeySource(file string) string {
	if file != "" {
		return "--authkey-file " + file
	}
	if _, ok := os.LookupEnv(EnvKey); ok {
		if f := os.Getenv(EnvKeyFile); f != "" {
			return "$" + EnvKey + " ($" + EnvKeyFile + "=" + f + " is set too, and ignored while $" + EnvKey + " is set)"
		}
		return "$" + EnvKey
	}
	if f := os.Getenv(EnvKeyFile); f != "" {
		return "the file " + f + " named by $" + EnvKeyFile
	}
	return "nowhere: no key is set"
}

// LooseMode reports whether a key file can be read or written by group or
// others, with its permission bits.
func LooseMode(path string) (os.FileMode, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	return fi.Mode().Perm(), fi.Mode().Perm()&0o077 != 0
}
