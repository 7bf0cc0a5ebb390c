package proxy_test

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
)

func TestDialEnvReadsAddressAndKey(t *testing.T) {
	path, _ := serve(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()

	keyFile := filepath.Join(t.TempDir(), "authkey")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(clientKey)+"\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"hex key", map[string]string{"SYNCMGR_AUTHKEY": hex.EncodeToString(clientKey)}},
		{"key file", map[string]string{"SYNCMGR_AUTHKEY_FILE": keyFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SYNCMGR_AUTHKEY", "")
			os.Unsetenv("SYNCMGR_AUTHKEY")
			t.Setenv("SYNCMGR_AUTHKEY_FILE", "")
			t.Setenv("SYNCMGR_ADDRESS", path)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c, err := proxy.DialEnv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ev, err := c.Event(ctx, "dialenv-"+strings.ReplaceAll(tc.name, " ", "-"))
			if err != nil {
				t.Fatal(err)
			}
			if err := ev.Set(ctx); err != nil {
				t.Fatal(err)
			}
			if ok, err := ev.IsSet(ctx); err != nil || !ok {
				t.Fatalf("IsSet = %v, %v", ok, err)
			}
		})
	}
}

func TestDialEnvErrors(t *testing.T) {
	path, _ := serve(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	t.Setenv("SYNCMGR_ADDRESS", path)
	t.Setenv("SYNCMGR_AUTHKEY_FILE", "")
	t.Setenv("SYNCMGR_AUTHKEY", "")
	os.Unsetenv("SYNCMGR_AUTHKEY")
	if _, err := proxy.DialEnv(ctx); !errors.Is(err, proxy.ErrNoKey) {
		t.Fatalf("no key: err = %v, want ErrNoKey", err)
	}
	t.Setenv("SYNCMGR_AUTHKEY", "not hex")
	if _, err := proxy.DialEnv(ctx); err == nil || !strings.Contains(err.Error(), "SYNCMGR_AUTHKEY") {
		t.Fatalf("bad key: err = %v", err)
	}
	t.Setenv("SYNCMGR_AUTHKEY", hex.EncodeToString([]byte("a different key")))
	if _, err := proxy.DialEnv(ctx); !errors.Is(err, proxy.ErrAuthFailed) || !strings.Contains(err.Error(), "the key came from $SYNCMGR_AUTHKEY") {
		t.Fatalf("wrong key: err = %v, want ErrAuthFailed naming $SYNCMGR_AUTHKEY", err)
	}
	// Both variables set: the error names the one used and the one ignored.
	keyFile := filepath.Join(t.TempDir(), "authkey")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(clientKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYNCMGR_AUTHKEY_FILE", keyFile)
	if _, err := proxy.DialEnv(ctx); !errors.Is(err, proxy.ErrAuthFailed) || !strings.Contains(err.Error(), keyFile+" is set too, and ignored") {
		t.Fatalf("wrong key with both set: err = %v", err)
	}
	t.Setenv("SYNCMGR_AUTHKEY_FILE", "")
	t.Setenv("SYNCMGR_AUTHKEY", hex.EncodeToString(clientKey))
	t.Setenv("SYNCMGR_ADDRESS", filepath.Join(t.TempDir(), "nothing.sock"))
	if _, err := proxy.DialEnv(ctx); !errors.Is(err, proxy.ErrNoDaemon) || !strings.Contains(err.Error(), "nothing.sock") {
		t.Fatalf("no daemon: err = %v, want ErrNoDaemon", err)
	}
	// No daemon and no key: the missing daemon is reported first.
	os.Unsetenv("SYNCMGR_AUTHKEY")
	if _, err := proxy.DialEnv(ctx); !errors.Is(err, proxy.ErrNoDaemon) || !strings.Contains(err.Error(), "no authkey") {
		t.Fatalf("no daemon, no key: err = %v, want ErrNoDaemon that also says no key is set", err)
	}
}

func TestDefaultAddressFollowsTheEnvironment(t *testing.T) {
	t.Setenv("SYNCMGR_ADDRESS", "tcp://head:7791")
	if got := proxy.DefaultAddress(); got != "tcp://head:7791" {
		t.Fatalf("DefaultAddress = %q", got)
	}
	t.Setenv("SYNCMGR_ADDRESS", "")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1234")
	if got, want := proxy.DefaultAddress(), server.DefaultSocketPath(); got != want || got != "/run/user/1234/syncmgr.sock" {
		t.Fatalf("DefaultAddress = %q, daemon default %q", got, want)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	if got, want := proxy.DefaultAddress(), server.DefaultSocketPath(); got != want {
		t.Fatalf("DefaultAddress = %q, daemon default %q", got, want)
	}
}

// A queue item that does not decode is not lost: Get fails and the item is
// back at the front, for a client that can read it.
func TestUndecodableItemGoesBack(t *testing.T) {
	path, _ := serve(t, server.Config{})
	c := dialC(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	q, err := c.Queue(ctx, "undecodable", 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := proxy.Pickle{proxy.ValueTag, 0xc1} // tagged, but 0xc1 is no msgpack
	if err := q.Put(ctx, bad); err != nil {
		t.Fatal(err)
	}
	if err := q.Put(ctx, "next"); err != nil {
		t.Fatal(err)
	}
	if v, err := q.Get(ctx); err == nil {
		t.Fatalf("Get of a malformed item = %#v, want an error", v)
	}
	deadline := time.Now().Add(bound)
	for { // the unget is sent without a reply: let it arrive
		if n, _ := q.Len(ctx); n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if n, _ := q.Len(ctx); n != 2 {
		t.Fatalf("queue holds %d items after a failed Get, want 2", n)
	}
	if _, err := q.Get(ctx); err == nil {
		t.Fatal("the malformed item is not first again")
	}
}
