//go:build race

package tests

// raceEnabled: the test binary runs under the race detector, so the daemon
// is built with it too and its races fail the tests.
const raceEnabled = true
