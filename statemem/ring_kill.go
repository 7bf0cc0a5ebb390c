//go:build !synctest

package statemem

// step marks a labelled step of a ClientRing op. Only a test build (the
// synctest tag: ring_kill_synctest.go) can be told to die there.
func step(int32) {}
