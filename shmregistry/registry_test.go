package shmregistry

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func open(t *testing.T, dir string, limit int64) *Registry {
	t.Helper()
	r, _, err := Open(dir, Prefix("/tmp/test.sock"), limit)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCreateAttachUnlink(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, 0)
	seg, err := r.Create(1, "buf", 4096)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(seg.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != 4096 {
		t.Fatalf("file mode %v size %d", fi.Mode(), fi.Size())
	}
	if _, err := r.Create(2, "buf", 10); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if s, err := r.Attach(2, "buf"); err != nil || s.Attached != 2 {
		t.Fatalf("attach: %+v %v", s, err)
	}
	r.EndSession(2)
	if l := r.List(); len(l) != 1 || l[0].Attached != 1 {
		t.Fatalf("after session end: %+v", l)
	}
	if err := r.Unlink("buf"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(seg.Path); !os.IsNotExist(err) {
		t.Fatalf("file still there: %v", err)
	}
	if _, err := r.Attach(1, "buf"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("attach after unlink: %v", err)
	}
	anon, err := r.Create(1, "", 8)
	if err != nil || !strings.HasPrefix(anon.Name, "sm-") {
		t.Fatalf("generated name: %+v %v", anon, err)
	}
}

func TestBadInput(t *testing.T) {
	r := open(t, t.TempDir(), 1000)
	for _, name := range []string{"a/b", "..", ".hidden", "nul\x00", strings.Repeat("x", MaxNameLen+1)} {
		if _, err := r.Create(1, name, 10); !errors.Is(err, ErrBadName) {
			t.Errorf("name %q: %v", name, err)
		}
	}
	for _, size := range []int64{0, -1} {
		if _, err := r.Create(1, "s", size); !errors.Is(err, ErrSize) {
			t.Errorf("size %d: %v", size, err)
		}
	}
	if _, err := r.Create(1, "big", 2000); !errors.Is(err, ErrLimit) {
		t.Errorf("over the limit: %v", err)
	}
	if total, _ := r.Usage(); total != 0 {
		t.Errorf("a failed create left %d bytes counted", total)
	}
}

func TestAdoptAfterCrashAndCloseUnlinksAll(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, 0)
	if _, err := r.Create(1, "keep", 64); err != nil {
		t.Fatal(err)
	}
	// A file of another daemon (another address) in the same directory.
	other := filepath.Join(dir, Prefix("/elsewhere.sock")+"theirs")
	if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The daemon "crashes": r is dropped without Close. A new one adopts.
	r2, adopted, err := Open(dir, Prefix("/tmp/test.sock"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(adopted) != 1 || adopted[0] != "keep" {
		t.Fatalf("adopted %v", adopted)
	}
	if s, err := r2.Attach(5, "keep"); err != nil || !s.Adopted || s.Size != 64 {
		t.Fatalf("attach adopted: %+v %v", s, err)
	}
	r2.Close()
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != filepath.Base(other) {
		t.Fatalf("after close: %v (only the other daemon's file should remain)", ents)
	}
	if _, err := r2.Create(1, "late", 8); !errors.Is(err, ErrClosed) {
		t.Fatalf("create after close: %v", err)
	}
}
