package statemem

import "testing"

// BenchmarkLockUncontended is the daemon's (and the Go client's) cost of an
// uncontended acquire+release on a mapped word.
func BenchmarkLockUncontended(b *testing.B) {
	s, err := Create(4)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	for i := 0; i < b.N; i++ {
		LockAcquire(w, aux, 1, 1, 0)
		LockRelease(w, aux)
	}
}
