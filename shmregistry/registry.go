package shmregistry

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/internal/fsafe"
)

// Errors of the registry; the transport maps them to wire codes.
var (
	ErrExists   = errors.New("segment exists")
	ErrNotFound = errors.New("no such segment")
	ErrBadName  = errors.New("bad segment name")
	ErrSize     = errors.New("bad segment size")
	ErrLimit    = errors.New("shared memory limit reached")
	ErrNoSpace  = errors.New("no space for shared memory")
	ErrClosed   = errors.New("registry closed")
)

// MaxNameLen is the longest segment name.
const MaxNameLen = 100

// filePrefix starts every segment file name. The file is named
// syncmgr-<16 random hex digits>-<name>: the random part is drawn per
// segment, so no other user can guess a file name and create it first.
const filePrefix = "syncmgr-"

// Segment describes one registered segment.
type Segment struct {
	Name     string    `msgpack:"name"`
	Path     string    `msgpack:"path"`
	Size     int64     `msgpack:"size"`
	Creator  uint64    `msgpack:"creator"` // session id; 0 for adopted segments
	Attached int       `msgpack:"attached"`
	Created  time.Time `msgpack:"-"`
	Age      float64   `msgpack:"age"`
	Adopted  bool      `msgpack:"adopted"`

	dev, ino uint64 // identify the file we made
}

// Registry owns the segments of one daemon.
type Registry struct {
	dir      string
	manifest string // path of the manifest in the private state directory
	lock     *fsafe.Lock
	limit    int64

	mu       sync.Mutex
	segs     map[string]*Segment
	attached map[uint64]map[string]int // session -> name -> count
	total    int64
	closed   bool
}

// Options say where a registry keeps its files.
type Options struct {
	// Dir is the (tmpfs) directory holding the segment files.
	Dir string
	// StateDir is a directory private to this user (checked: ours, not
	// writable by group or others) holding the manifest and its lock.
	StateDir string
	// Name names the manifest: StateDir/Name.shm, locked through
	// StateDir/Name.shm.lock for the daemon's lifetime. A daemon restarted
	// with the same StateDir and Name adopts what the manifest lists.
	Name string
	// Limit caps all segments together in bytes; 0 means no cap but the
	// file system's.
	Limit int64
	// Ephemeral marks a daemon that is never restarted on its address (an
	// embedded one): Name is left empty and a fresh "run-<random>" is used,
	// and once the daemon is dead (its lock free) Sweep removes its
	// segments.
	Ephemeral bool
}

// Report says what Open did with a previous run's manifest.
type Report struct {
	Adopted []string // segment names
	Refused []string // "name: reason" for entries that failed a check
}

// manifestFile is the JSON manifest: what this daemon (or its previous run)
// made, with what identifies each file.
type manifestFile struct {
	Version  int             `json:"version"`
	Segments []manifestEntry `json:"segments"`
}

type manifestEntry struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Dev     uint64    `json:"dev"`
	Ino     uint64    `json:"ino"`
	Created time.Time `json:"created"`
}

// ManifestSuffix ends every manifest file name; LockSuffix every lock's.
const (
	ManifestSuffix = ".shm"
	LockSuffix     = ".shm.lock"
)

// Open returns a registry keeping segment files in o.Dir. It takes the
// manifest's lock (failing with an error wrapping fsafe.ErrLocked when a
// live daemon holds it) and adopts the segments the manifest lists, each
// only if it is still the file this daemon made: a regular file of ours,
// mode 0600, one link, the same inode and the recorded size. Nothing else in
// o.Dir is ever opened, adopted or removed.
func Open(o Options) (*Registry, Report, error) {
	var rep Report
	fi, err := os.Stat(o.Dir)
	if err != nil {
		return nil, rep, fmt.Errorf("shared memory directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, rep, fmt.Errorf("shared memory directory %s is not a directory", o.Dir)
	}
	if o.Ephemeral {
		if o.Name != "" {
			return nil, rep, errors.New("an ephemeral registry names its own manifest")
		}
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.Name = runPrefix + hex.EncodeToString(b[:])
	} else if strings.HasPrefix(o.Name, runPrefix) {
		return nil, rep, fmt.Errorf("shared memory manifest name %q is reserved for ephemeral runs", o.Name)
	}
	if o.Name == "" || strings.ContainsRune(o.Name, '/') {
		return nil, rep, fmt.Errorf("shared memory manifest name %q is not a file name", o.Name)
	}
	if err := fsafe.EnsureDir(o.StateDir); err != nil {
		return nil, rep, fmt.Errorf("shared memory state directory: %w", err)
	}
	base := filepath.Join(o.StateDir, o.Name)
	var lock *fsafe.Lock
	if o.Ephemeral {
		lock, err = fsafe.CreateLocked(base + LockSuffix) // never seen unlocked by Sweep
	} else {
		lock, err = fsafe.TryLock(base + LockSuffix)
	}
	if err != nil {
		return nil, rep, fmt.Errorf("shared memory manifest: %w", err)
	}
	r := &Registry{dir: o.Dir, manifest: base + ManifestSuffix, lock: lock, limit: o.Limit,
		segs: make(map[string]*Segment), attached: make(map[uint64]map[string]int)}
	entries, err := readManifest(r.manifest)
	if err != nil {
		lock.Release(false)
		return nil, rep, err
	}
	for _, e := range entries {
		if err := verify(e); err != nil {
			rep.Refused = append(rep.Refused, e.Name+": "+err.Error())
			continue
		}
		if _, dup := r.segs[e.Name]; dup || validName(e.Name) != nil {
			rep.Refused = append(rep.Refused, e.Name+": bad or duplicate name")
			continue
		}
		r.segs[e.Name] = &Segment{Name: e.Name, Path: e.Path, Size: e.Size, Created: e.Created, Adopted: true,
			dev: e.Dev, ino: e.Ino}
		r.total += e.Size
		rep.Adopted = append(rep.Adopted, e.Name)
	}
	sort.Strings(rep.Adopted)
	if err := r.writeManifestLocked(); err != nil {
		lock.Release(false)
		return nil, rep, err
	}
	return r, rep, nil
}

// runPrefix starts the manifest names of ephemeral daemons.
const runPrefix = "run-"

// Sweep removes the segments of ephemeral daemons whose manifests are in
// stateDir and that are provably dead: the kernel has released their
// manifest lock, which they held for as long as they lived. Only files that
// pass the adoption checks (ours, 0600, one link, same inode and size) are
// removed. It returns the paths removed.
func Sweep(stateDir string) ([]string, error) {
	if err := fsafe.CheckDir(stateDir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	ents, err := os.ReadDir(stateDir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		base, ok := strings.CutSuffix(e.Name(), LockSuffix)
		if !ok || !strings.HasPrefix(base, runPrefix) || !e.Type().IsRegular() {
			continue
		}
		lock, err := fsafe.OpenLock(filepath.Join(stateDir, e.Name()))
		if err != nil {
			continue // alive (locked), not ours, or already swept by another daemon
		}
		manifest := filepath.Join(stateDir, base+ManifestSuffix)
		entries, err := readManifest(manifest)
		if err != nil {
			lock.Release(false)
			continue
		}
		for _, m := range entries {
			if verify(m) == nil && os.Remove(m.Path) == nil {
				removed = append(removed, m.Path)
			}
		}
		_ = os.Remove(manifest)
		lock.Release(true)
	}
	return removed, nil
}

// readManifest reads a manifest that must be a private file of ours; a
// missing one is an empty list.
func readManifest(path string) ([]manifestEntry, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open shared memory manifest: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := fsafe.CheckFD(fd, path, 0o600, -1); err != nil {
		return nil, fmt.Errorf("shared memory manifest: %w", err)
	}
	var m manifestFile
	if err := json.NewDecoder(io.LimitReader(f, 64<<20)).Decode(&m); err != nil {
		return nil, fmt.Errorf("shared memory manifest %s: %w", path, err)
	}
	return m.Segments, nil
}

// verify checks that a manifest entry still names the file we made.
func verify(e manifestEntry) error {
	if !filepath.IsAbs(e.Path) || !strings.HasPrefix(filepath.Base(e.Path), filePrefix) {
		return errors.New("not a segment path")
	}
	fd, err := unix.Open(e.Path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer unix.Close(fd)
	if err := fsafe.CheckFD(fd, e.Path, 0o600, e.Size); err != nil {
		return err
	}
	dev, ino, err := fsafe.Stat(fd)
	if err != nil {
		return err
	}
	if dev != e.Dev || ino != e.Ino {
		return errors.New("the file was replaced")
	}
	return nil
}

// writeManifestLocked replaces the manifest with the current segments
// (write to a temporary file, then rename).
func (r *Registry) writeManifestLocked() error {
	m := manifestFile{Version: 1, Segments: make([]manifestEntry, 0, len(r.segs))}
	for _, s := range r.segs {
		m.Segments = append(m.Segments, manifestEntry{Name: s.Name, Path: s.Path, Size: s.Size, Dev: s.dev, Ino: s.ino, Created: s.Created})
	}
	sort.Slice(m.Segments, func(i, j int) bool { return m.Segments[i].Name < m.Segments[j].Name })
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := r.manifest + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("write shared memory manifest: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, r.manifest)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write shared memory manifest: %w", err)
	}
	return nil
}

// Dir returns the directory holding the segment files.
func (r *Registry) Dir() string { return r.dir }

func validName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: a name is 1 to %d bytes long", ErrBadName, MaxNameLen)
	}
	if name == "." || name == ".." || strings.HasPrefix(name, ".") {
		return fmt.Errorf("%w: a name must not start with '.'", ErrBadName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("%w: byte 0x%02x at %d is not allowed (use A-Z a-z 0-9 _ - .)", ErrBadName, c, i)
		}
	}
	return nil
}

// Create makes a segment of size bytes. An empty name gets a generated one.
func (r *Registry) Create(session uint64, name string, size int64) (Segment, error) {
	if name == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		name = "sm-" + hex.EncodeToString(b[:])
	} else if err := validName(name); err != nil {
		return Segment{}, err
	}
	if size <= 0 {
		return Segment{}, fmt.Errorf("%w: size must be > 0, got %d", ErrSize, size)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return Segment{}, ErrClosed
	}
	if _, ok := r.segs[name]; ok {
		return Segment{}, fmt.Errorf("%w: %q", ErrExists, name)
	}
	if r.limit > 0 && size > r.limit-r.total { // not total+size: that overflows for sizes near 2^63

		return Segment{}, fmt.Errorf("%w: %d bytes requested, %d of %d in use (--shm-limit)", ErrLimit, size, r.total, r.limit)
	}
	path, fd, err := r.createFile(name)
	if err != nil {
		return Segment{}, err
	}
	defer unix.Close(fd)
	if err := reserve(fd, size); err != nil {
		_ = unix.Unlink(path)
		return Segment{}, err
	}
	dev, ino, err := fsafe.Stat(fd)
	if err != nil {
		_ = unix.Unlink(path)
		return Segment{}, fmt.Errorf("stat segment file: %w", err)
	}
	s := &Segment{Name: name, Path: path, Size: size, Creator: session, Created: time.Now(), dev: dev, ino: ino}
	r.segs[name] = s
	if err := r.writeManifestLocked(); err != nil {
		delete(r.segs, name)
		_ = unix.Unlink(path)
		return Segment{}, err
	}
	r.total += size
	r.attachLocked(session, name)
	return *s, nil
}

// createFile makes a new, empty 0600 file for segment name.
func (r *Registry) createFile(name string) (string, int, error) {
	for range 4 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		path := filepath.Join(r.dir, filePrefix+hex.EncodeToString(b[:])+"-"+name)
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue // someone guessed 64 random bits; draw again
		}
		if err != nil {
			return "", -1, fmt.Errorf("create segment file: %w", err)
		}
		if err := unix.Fchmod(fd, 0o600); err != nil { // the umask may have narrowed it; never widened
			unix.Close(fd)
			_ = unix.Unlink(path)
			return "", -1, fmt.Errorf("create segment file: %w", err)
		}
		return path, fd, nil
	}
	return "", -1, fmt.Errorf("%w: could not find a free file name in %s", ErrExists, r.dir)
}

// reserve sizes the file and reserves its pages, so that a full tmpfs fails
// here with a clear error rather than with SIGBUS in a client.
func reserve(fd int, size int64) error {
	err := unix.Fallocate(fd, 0, 0, size)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: %d bytes: the shared memory filesystem is full", ErrNoSpace, size)
	}
	if errors.Is(err, unix.EFBIG) || errors.Is(err, unix.EINVAL) && size > 1<<40 {
		return fmt.Errorf("%w: %d bytes is too large", ErrSize, size)
	}
	if errors.Is(err, unix.EOPNOTSUPP) { // not tmpfs: size it at least
		if err := unix.Ftruncate(fd, size); err != nil {
			return fmt.Errorf("size segment file: %w", err)
		}
		return nil
	}
	return fmt.Errorf("reserve segment pages: %w", err)
}

// Attach records that session maps the segment and returns it.
func (r *Registry) Attach(session uint64, name string) (Segment, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.segs[name]
	if !ok {
		return Segment{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	r.attachLocked(session, name)
	return *s, nil
}

func (r *Registry) attachLocked(session uint64, name string) {
	m := r.attached[session]
	if m == nil {
		m = make(map[string]int)
		r.attached[session] = m
	}
	m[name]++
	r.segs[name].Attached++
}

// Detach records that session unmapped the segment.
func (r *Registry) Detach(session uint64, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.detachLocked(session, name, 1)
}

func (r *Registry) detachLocked(session uint64, name string, n int) {
	m := r.attached[session]
	if m == nil || m[name] == 0 {
		return
	}
	n = min(n, m[name])
	if m[name] -= n; m[name] == 0 {
		delete(m, name)
	}
	if len(m) == 0 {
		delete(r.attached, session)
	}
	if s, ok := r.segs[name]; ok {
		s.Attached -= n
	}
}

// EndSession forgets a session's attachments (its mappings died with it).
func (r *Registry) EndSession(session uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, n := range r.attached[session] {
		r.detachLocked(session, name, n)
	}
}

// Unlink removes a segment's file and forgets it. Existing mappings stay
// valid until unmapped, as with POSIX shm_unlink.
func (r *Registry) Unlink(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.segs[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	r.removeLocked(s)
	_ = r.writeManifestLocked() // a stale entry fails verification at adoption anyway
	return nil
}

func (r *Registry) removeLocked(s *Segment) {
	_ = os.Remove(s.Path) // already gone is fine: the entry is forgotten either way
	delete(r.segs, s.Name)
	r.total -= s.Size
	for sess, m := range r.attached {
		delete(m, s.Name)
		if len(m) == 0 {
			delete(r.attached, sess)
		}
	}
}

// List returns every segment, sorted by name.
func (r *Registry) List() []Segment {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Segment, 0, len(r.segs))
	now := time.Now()
	for _, s := range r.segs {
		c := *s
		c.Age = now.Sub(s.Created).Seconds()
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Usage returns the bytes in use and the cap (0: none).
func (r *Registry) Usage() (total, limit int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total, r.limit
}

// Close unlinks every segment and the manifest, and releases the lock;
// later creations fail.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	for _, s := range r.segs {
		r.removeLocked(s)
	}
	_ = os.Remove(r.manifest)
	r.lock.Release(true)
}
