package auth

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewKey(t *testing.T) {
	a, err := NewKey()
	if err != nil || len(a) != KeySize {
		t.Fatalf("%x %v", a, err)
	}
	b, _ := NewKey()
	if bytes.Equal(a, b) {
		t.Fatal("two keys are equal")
	}
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		in   string
		want []byte
		ok   bool
	}{
		{"00ff", []byte{0, 0xff}, true},
		{"  00FF\n", []byte{0, 0xff}, true},
		{"", nil, false},
		{"   \n", nil, false},
		{"0", nil, false},
		{"zz", nil, false},
		{"secret-not-hex", nil, false},
	}
	for _, tt := range tests {
		k, err := ParseKey(tt.in)
		if tt.ok != (err == nil) || !bytes.Equal(k, tt.want) {
			t.Errorf("ParseKey(%q) = %x, %v", tt.in, k, err)
		}
		if err != nil && (!errors.Is(err, ErrBadKey) || strings.Contains(err.Error(), "secret")) {
			t.Errorf("ParseKey(%q): error %v", tt.in, err)
		}
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte("aabb\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(dir, "envkey")
	if err := os.WriteFile(envFile, []byte("ccdd"), 0o600); err != nil {
		t.Fatal(err)
	}
	badFile := filepath.Join(dir, "bad")
	if err := os.WriteFile(badFile, []byte("topsecret"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Setenv(EnvKey, "")
	os.Unsetenv(EnvKey)
	t.Setenv(EnvKeyFile, "")
	if _, found, err := LoadKey(""); found || err != nil {
		t.Fatalf("nothing set: found=%v err=%v", found, err)
	}

	t.Setenv(EnvKeyFile, envFile)
	if k, found, err := LoadKey(""); !found || err != nil || hex.EncodeToString(k) != "ccdd" {
		t.Fatalf("key file from env: %x %v %v", k, found, err)
	}
	t.Setenv(EnvKey, "eeff")
	if k, _, err := LoadKey(""); err != nil || hex.EncodeToString(k) != "eeff" {
		t.Fatalf("$%s wins over $%s: %x %v", EnvKey, EnvKeyFile, k, err)
	}
	if k, _, err := LoadKey(file); err != nil || hex.EncodeToString(k) != "aabb" {
		t.Fatalf("the named file wins: %x %v", k, err)
	}
	t.Setenv(EnvKey, "topsecret")
	if _, found, err := LoadKey(""); !found || !errors.Is(err, ErrBadKey) || strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("bad env key: %v %v", found, err)
	}
	if _, _, err := LoadKey(badFile); !errors.Is(err, ErrBadKey) || strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("bad key file: %v", err)
	}
	if _, _, err := LoadKey(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing key file accepted")
	}
}
