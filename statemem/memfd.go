package statemem

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// sealedMemory makes the daemon's shared memory: an anonymous memory file
// (memfd_create) of size bytes, mode 0600, its pages reserved now when
// reserve is set (a full tmpfs fails here, not later as a SIGBUS in
// whichever process touches the page first; a Queue ring is not reserved:
// its pages exist only once touched, see Ring), sealed against shrinking and growing (Seals), and mapped
// read-write. It has no name in any directory, so nothing is left behind
// when the daemon dies and no other user can plant one in its place;
// clients get it only as a descriptor passed over a connection (SCM_RIGHTS).
// The file is named syncmgr-what ("state", "queue"), in /proc maps and errors.
func sealedMemory(what string, size int64, reserve bool) (fd int, mem []byte, err error) {
	fd, err = unix.MemfdCreate("syncmgr-"+what, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("statemem: memfd_create %s: %w", what, err)
	}
	fail := func(err error) (int, []byte, error) {
		unix.Close(fd)
		return -1, nil, err
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail(fmt.Errorf("statemem: chmod %s: %w", what, err))
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fail(fmt.Errorf("statemem: size %s: %w", what, err))
	}
	if reserve {
		if err := unix.Fallocate(fd, 0, 0, size); err != nil && err != unix.EOPNOTSUPP {
			return fail(fmt.Errorf("statemem: reserve %s: %w", what, err))
		}
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, Seals); err != nil {
		return fail(fmt.Errorf("statemem: seal %s: %w", what, err))
	}
	if err := checkFD(fd, size); err != nil {
		return fail(err)
	}
	mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("statemem: map %s: %w", what, err))
	}
	return fd, mem, nil
}
