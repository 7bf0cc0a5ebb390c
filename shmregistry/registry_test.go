package shmregistry

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncmgr/syncmgr/internal/fsafe"
)

func open(t *testing.T, dir string, limit int64) *Registry {
	t.Helper()
	r, _, err := Open(Options{Dir: dir, StateDir: filepath.Join(dir, "state"), Name: "test.sock", Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// crash drops r as a SIGKILL would: its files stay, its lock is released.
func crash(r *Registry) { r.lock.Release(false) }

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
	// A file of another daemon in the same directory.
	other := filepath.Join(dir, "syncmgr-0123456789abcdef-theirs")
	if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// While r lives, a second registry on the same manifest is refused.
	if _, _, err := Open(Options{Dir: dir, StateDir: filepath.Join(dir, "state"), Name: "test.sock"}); !errors.Is(err, fsafe.ErrLocked) {
		t.Fatalf("second open while the first lives: %v", err)
	}
	crash(r)
	r2, rep, err := Open(Options{Dir: dir, StateDir: filepath.Join(dir, "state"), Name: "test.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Adopted) != 1 || rep.Adopted[0] != "keep" || len(rep.Refused) != 0 {
		t.Fatalf("report %+v", rep)
	}
	if s, err := r2.Attach(5, "keep"); err != nil || !s.Adopted || s.Size != 64 {
		t.Fatalf("attach adopted: %+v %v", s, err)
	}
	r2.Close()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 2 || names[0] != "state" || names[1] != filepath.Base(other) {
		t.Fatalf("after close: %v (only the other daemon's file and the state dir should remain)", names)
	}
	if st, _ := os.ReadDir(filepath.Join(dir, "state")); len(st) != 0 {
		t.Fatalf("state dir after close: %v", st)
	}
	if _, err := r2.Create(1, "late", 8); !errors.Is(err, ErrClosed) {
		t.Fatalf("create after close: %v", err)
	}
}

// TestAdoptsOnlyWhatItMade tampers with the files of a crashed run in every
// way another user or an accident could, and checks that only the untouched
// file is adopted and nothing else in the directory is.
func TestAdoptsOnlyWhatItMade(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, 1<<20)
	paths := map[string]string{}
	for _, n := range []string{"symlink", "sparse", "mode", "linked", "replaced", "owner", "good"} {
		s, err := r.Create(1, n, 4096)
		if err != nil {
			t.Fatal(err)
		}
		paths[n] = s.Path
	}
	crash(r)
	target := filepath.Join(dir, "target")
	must(t, os.WriteFile(target, make([]byte, 4096), 0o600))
	must(t, os.Remove(paths["symlink"]))
	must(t, os.Symlink(target, paths["symlink"]))
	must(t, os.Truncate(paths["sparse"], 1<<40))
	must(t, os.Chmod(paths["mode"], 0o644))
	must(t, os.Link(paths["linked"], filepath.Join(dir, "hardlink")))
	must(t, os.WriteFile(paths["replaced"]+".new", make([]byte, 4096), 0o600))
	must(t, os.Rename(paths["replaced"]+".new", paths["replaced"])) // a new inode at the same path
	if os.Geteuid() == 0 {
		must(t, os.Chown(paths["owner"], 64002, 64002))
	} else {
		must(t, os.Remove(paths["owner"])) // cannot give a file away: a missing file is refused too
	}
	// A planted file in the segment naming scheme that no manifest lists.
	must(t, os.WriteFile(filepath.Join(dir, "syncmgr-00112233aabbccdd-planted"), make([]byte, 4096), 0o600))

	r2, rep, err := Open(Options{Dir: dir, StateDir: filepath.Join(dir, "state"), Name: "test.sock", Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if len(rep.Adopted) != 1 || rep.Adopted[0] != "good" || len(rep.Refused) != 6 {
		t.Fatalf("adopted %v, refused %v", rep.Adopted, rep.Refused)
	}
	if used, _ := r2.Usage(); used != 4096 {
		t.Fatalf("usage %d counts files that were not adopted", used)
	}
	for _, n := range []string{"symlink", "sparse", "planted", "replaced"} {
		if _, err := r2.Attach(1, n); !errors.Is(err, ErrNotFound) {
			t.Errorf("attach %s: %v", n, err)
		}
	}
	// Names are free again, and new files never collide with planted ones.
	if _, err := r2.Create(1, "sparse", 4096); err != nil {
		t.Fatalf("create after refusing a 1 TiB file: %v", err)
	}
	if b, _ := os.ReadFile(target); len(b) != 4096 {
		t.Fatal("the symlink target was touched")
	}
}

// TestManifestMustBePrivate refuses a state directory or manifest that
// another user could have written.
func TestManifestMustBePrivate(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	must(t, os.Mkdir(state, 0o777))
	must(t, os.Chmod(state, 0o777))
	if _, _, err := Open(Options{Dir: dir, StateDir: state, Name: "x"}); !errors.Is(err, fsafe.ErrNotPrivate) {
		t.Fatalf("world-writable state dir: %v", err)
	}
	must(t, os.Chmod(state, 0o700))
	must(t, os.WriteFile(filepath.Join(state, "x.shm"), []byte(`{"version":1,"segments":[]}`), 0o666))
	must(t, os.Chmod(filepath.Join(state, "x.shm"), 0o666))
	if _, _, err := Open(Options{Dir: dir, StateDir: state, Name: "x"}); !errors.Is(err, fsafe.ErrNotPrivate) {
		t.Fatalf("world-writable manifest: %v", err)
	}
}

// TestSweepRemovesOnlyDeadEphemeralRuns: the segments of an ephemeral
// daemon that died are removed by the next sweep; a live one's stay.
func TestSweepRemovesOnlyDeadEphemeralRuns(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "runs")
	live, _, err := Open(Options{Dir: dir, StateDir: state, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	dead, _, err := Open(Options{Dir: dir, StateDir: state, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := live.Create(1, "a", 64)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dead.Create(1, "b", 64)
	if err != nil {
		t.Fatal(err)
	}
	crash(dead)
	removed, err := Sweep(state)
	if err != nil || len(removed) != 1 || removed[0] != b.Path {
		t.Fatalf("sweep removed %v (%v), want only %s", removed, err, b.Path)
	}
	if _, err := os.Stat(a.Path); err != nil {
		t.Fatalf("a live run's segment was removed: %v", err)
	}
	if _, err := os.Stat(b.Path); !os.IsNotExist(err) {
		t.Fatalf("the dead run's segment is still there: %v", err)
	}
	ents, _ := os.ReadDir(state)
	if len(ents) != 2 { // the live run's manifest and lock
		t.Fatalf("state dir after sweep: %v", ents)
	}
}

func TestLimitCheckDoesNotOverflow(t *testing.T) {
	r := open(t, t.TempDir(), 1<<20)
	if _, err := r.Create(1, "small", 4096); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{math.MaxInt64, math.MaxInt64 - 4095, 1<<20 - 4095} {
		if _, err := r.Create(1, "huge", size); !errors.Is(err, ErrLimit) {
			t.Errorf("size %d with 4096 of 1 MiB in use: %v, want a limit error", size, err)
		}
	}
	if used, _ := r.Usage(); used != 4096 {
		t.Fatalf("usage %d after refused creations", used)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
