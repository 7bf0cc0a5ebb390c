// Package shmregistry keeps the shared-memory segments a syncmgr daemon owns.
//
// A segment is a file the daemon creates in a tmpfs directory (/dev/shm by
// default), mode 0600, with its pages reserved by fallocate so that a full
// /dev/shm is reported at creation instead of as SIGBUS on first write.
// Clients attach by name: the registry tells them the file's path and size,
// and they map it themselves. No client ever unlinks a segment by accident,
// because only the daemon does: on an explicit unlink, or on shutdown.
//
// Every file is named syncmgr-<16 random hex digits>-<name>, so nobody can
// create a segment's file before the daemon does. The daemon records each
// file it makes in a manifest in a directory private to its user, and holds
// the manifest's lock for its life: a daemon restarted on the same address
// after a crash adopts what the manifest lists (the data survives), each
// file only if it is still the one it made (a regular 0600 file of ours,
// one link, the recorded inode and size). Nothing else in the directory is
// ever opened, adopted or removed. An embedded daemon's manifest is its
// run's own, and Sweep removes the segments of a run whose lock is free.
//
// The package knows nothing about sockets; the server maps its ops here.
package shmregistry
