// Package shmregistry keeps the shared-memory segments a syncmgr daemon owns.
//
// A segment is a file the daemon creates in a tmpfs directory (/dev/shm by
// default), mode 0600, with its pages reserved by fallocate so that a full
// /dev/shm is reported at creation instead of as SIGBUS on first write.
// Clients attach by name: the registry tells them the file's path and size,
// and they map it themselves. No client ever unlinks a segment by accident,
// because only the daemon does: on an explicit unlink, or on shutdown.
//
// Every file carries a prefix derived from the daemon's address, so a daemon
// restarted on the same address after a crash finds its predecessor's
// segments and adopts them (the data survives), and daemons on other
// addresses never touch each other's files.
//
// The package knows nothing about sockets; the server maps its ops here.
package shmregistry
