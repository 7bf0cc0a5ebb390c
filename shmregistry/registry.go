package shmregistry

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
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
}

// Registry owns the segments of one daemon.
type Registry struct {
	dir    string
	prefix string
	limit  int64

	mu       sync.Mutex
	segs     map[string]*Segment
	attached map[uint64]map[string]int // session -> name -> count
	total    int64
	closed   bool
}

// Prefix returns the file-name prefix for a daemon serving address.
func Prefix(address string) string {
	sum := sha256.Sum256([]byte(address))
	return "syncmgr-" + hex.EncodeToString(sum[:5]) + "-"
}

// Open returns a registry keeping files in dir named prefix+name, with a cap
// of limit bytes in all (0: no cap but the filesystem's). Files left in dir
// with the same prefix by a previous run are adopted.
func Open(dir, prefix string, limit int64) (*Registry, []string, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("shared memory directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("shared memory directory %s is not a directory", dir)
	}
	r := &Registry{dir: dir, prefix: prefix, limit: limit, segs: make(map[string]*Segment), attached: make(map[uint64]map[string]int)}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("scan shared memory directory: %w", err)
	}
	var adopted []string
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.Type().IsRegular() || validName(name) != nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		r.segs[name] = &Segment{Name: name, Path: filepath.Join(dir, e.Name()), Size: info.Size(), Created: info.ModTime(), Adopted: true}
		r.total += info.Size()
		adopted = append(adopted, name)
	}
	return r, adopted, nil
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
	if r.limit > 0 && r.total+size > r.limit {
		return Segment{}, fmt.Errorf("%w: %d bytes requested, %d of %d in use (--shm-limit)", ErrLimit, size, r.total, r.limit)
	}
	path := filepath.Join(r.dir, r.prefix+name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return Segment{}, fmt.Errorf("%w: a file %s is in the way", ErrExists, path)
		}
		return Segment{}, fmt.Errorf("create segment file: %w", err)
	}
	defer unix.Close(fd)
	if err := reserve(fd, size); err != nil {
		_ = unix.Unlink(path)
		return Segment{}, err
	}
	s := &Segment{Name: name, Path: path, Size: size, Creator: session, Created: time.Now()}
	r.segs[name] = s
	r.total += size
	r.attachLocked(session, name)
	return *s, nil
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

// Close unlinks every segment; later creations fail.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, s := range r.segs {
		r.removeLocked(s)
	}
}
