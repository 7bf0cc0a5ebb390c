// Package fsafe holds the few file-system checks syncmgr relies on when it
// shares a machine with other users: private directories, lock files that
// prove a process is alive, and files opened without following symlinks.
//
// A lock is an flock(2) on a file; the kernel drops it when the holder dies,
// however it dies, so "the lock is free" proves "its holder is gone". A lock
// file is only ever acted on after checking that its path still names the
// locked inode, so a holder may remove its lock file when it stops.
package fsafe

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrLocked is returned by TryLock when another process holds the lock.
var ErrLocked = errors.New("locked by a running process")

// ErrNotPrivate is returned for a directory or file that another user could
// have made or could change.
var ErrNotPrivate = errors.New("not private to this user")

// CheckDir checks that dir is a real directory (not a symlink) owned by this
// user (or by root when we are root) that neither group nor others may write.
func CheckDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("cannot read the owner of %s", dir)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("directory %s belongs to uid %d, not to us (uid %d): %w", dir, st.Uid, os.Geteuid(), ErrNotPrivate)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("directory %s is writable by group or others (mode %04o): %w", dir, fi.Mode().Perm(), ErrNotPrivate)
	}
	return nil
}

// EnsureDir creates dir (and missing parents) mode 0700 when it does not
// exist, then checks it with CheckDir.
func EnsureDir(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create directory: %w", err)
		}
	}
	return CheckDir(dir)
}

// Lock is a held flock on a file.
type Lock struct {
	fd   int
	path string
}

// Path returns the lock file's path.
func (l *Lock) Path() string { return l.path }

// Release drops the lock; with remove it also unlinks the lock file first.
func (l *Lock) Release(remove bool) {
	if l == nil || l.fd < 0 {
		return
	}
	if remove {
		_ = unix.Unlink(l.path)
	}
	_ = unix.Close(l.fd)
	l.fd = -1
}

// TryLock takes an exclusive lock on path, creating the file 0600 when
// missing. It fails with ErrLocked when a live process holds it, and with
// ErrNotPrivate when the file is not a plain file of ours.
func TryLock(path string) (*Lock, error) {
	for range 8 {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock file %s: %w", path, err)
		}
		l, retry, err := lockFD(fd, path)
		if retry {
			continue
		}
		return l, err
	}
	return nil, fmt.Errorf("lock file %s keeps changing", path)
}

// OpenLock takes the lock on an existing file only (see TryLock).
func OpenLock(path string) (*Lock, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	l, retry, err := lockFD(fd, path)
	if retry {
		return nil, fmt.Errorf("lock file %s: %w", path, fs.ErrNotExist)
	}
	return l, err
}

func lockFD(fd int, path string) (l *Lock, retry bool, err error) {
	if err := CheckFD(fd, path, 0o600, -1); err != nil {
		unix.Close(fd)
		return nil, false, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, fmt.Errorf("%s: %w", path, ErrLocked)
		}
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	// The previous holder may have removed the file between our open and
	// our flock: then we hold a lock on an orphan inode, which proves nothing.
	if !sameFile(fd, path) {
		unix.Close(fd)
		return nil, true, nil
	}
	return &Lock{fd: fd, path: path}, false, nil
}

// CreateLocked creates a new lock file at path, already locked when the path
// appears, so no other process can ever find it unlocked while we live. It
// fails when path exists.
func CreateLocked(path string) (*Lock, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+hex.EncodeToString(b[:]))
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create lock file: %w", err)
	}
	defer unix.Unlink(tmp)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", tmp, err)
	}
	if err := unix.Link(tmp, path); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create lock file %s: %w", path, err)
	}
	return &Lock{fd: fd, path: path}, nil
}

func sameFile(fd int, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Lstat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// CheckFD checks that the open file fd is a regular file owned by this user
// with exactly one link, permission bits perm, and (when size >= 0) size
// bytes long. path is only used in messages.
func CheckFD(fd int, path string, perm uint32, size int64) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%s is not a regular file: %w", path, ErrNotPrivate)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to uid %d, not to us (uid %d): %w", path, st.Uid, os.Geteuid(), ErrNotPrivate)
	case st.Mode&0o7777 != perm:
		return fmt.Errorf("%s has mode %04o, want %04o: %w", path, st.Mode&0o7777, perm, ErrNotPrivate)
	case st.Nlink != 1:
		return fmt.Errorf("%s has %d links, want 1: %w", path, st.Nlink, ErrNotPrivate)
	case size >= 0 && st.Size != size:
		return fmt.Errorf("%s is %d bytes, want %d: %w", path, st.Size, size, ErrNotPrivate)
	}
	return nil
}

// Stat returns the device and inode of fd.
func Stat(fd int) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, err
	}
	return st.Dev, st.Ino, nil
}
