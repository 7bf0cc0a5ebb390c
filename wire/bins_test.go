package wire

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestBinTuples(t *testing.T) {
	good, _ := msgpack.Marshal([][][]byte{{[]byte("k"), []byte("kp"), []byte("v")}, {[]byte("k2"), {}, []byte("v2")}})
	bins, err := BinTuples(good, 3)
	if err != nil || len(bins) != 6 || string(bins[0]) != "k" || string(bins[5]) != "v2" || len(bins[4]) != 0 {
		t.Fatalf("BinTuples = %q, %v", bins, err)
	}
	if cap(bins[0]) != len(bins[0]) {
		t.Fatal("a bin's capacity reaches into the frame")
	}
	list, _ := msgpack.Marshal([][]byte{[]byte("a"), []byte("bc")})
	if bins, err := BinTuples(list, 1); err != nil || len(bins) != 2 || string(bins[1]) != "bc" {
		t.Fatalf("BinTuples(list) = %q, %v", bins, err)
	}
	for name, b := range map[string][]byte{
		"pair":      mustMarshal(t, [][][]byte{{[]byte("k"), []byte("v")}}),
		"str":       mustMarshal(t, []string{"a"}),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0xc0),
		"claims":    {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc4, 0x00},
		"empty":     nil,
	} {
		k := 3
		if name == "str" || name == "claims" {
			k = 1
		}
		if _, err := BinTuples(b, k); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReadBodyAsItArrives: a body announced as 64 MiB of which 10
// bytes arrive costs about 1 MiB, not 64.
func TestReadBodyAsItArrives(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadBodyAsItArrives(bytes.NewReader(make([]byte, 10)), 64<<20)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Fatalf("allocated %d bytes for 10 arrived", got)
	}
	for _, c := range []struct {
		n     int
		alloc uint64 // at most, bytes
	}{
		{3<<20 + 5, 6<<20 + 64<<10},   // 1 MiB, 2 MiB, then the whole (a quarter over 2 MiB is 2.5 MiB)
		{1<<20 + 300, 1<<20 + 64<<10}, // a 1 MiB item and its envelope: the whole at once, no copy
		{5 << 20, 8<<20 + 64<<10},     // 1, 2, then the whole (at most a quarter over 4 MiB)
	} {
		want := bytes.Repeat([]byte{7}, c.n)
		runtime.ReadMemStats(&before)
		body, err := ReadBodyAsItArrives(bytes.NewReader(want), uint32(c.n))
		runtime.ReadMemStats(&after)
		if err != nil || !bytes.Equal(body, want) {
			t.Fatalf("full body of %d: %d bytes, %v", c.n, len(body), err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > c.alloc {
			t.Fatalf("a body of %d bytes allocated %d, want at most %d", c.n, got, c.alloc)
		}
	}
}
