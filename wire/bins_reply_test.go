package wire

import (
	"bytes"
	"testing"
)

// EncodeBinsReply's pieces, joined, are the bytes EncodeReply writes for
// the same items, at every bin header size and on both sides of the size
// from which an item is a piece of its own.
func TestEncodeBinsReplyMatchesEncodeReply(t *testing.T) {
	sizes := [][]int{
		{},
		{0},
		{1, 255, 256, 65535, 65536},
		{binPieceMin - 1, binPieceMin, binPieceMin + 1},
		{1 << 20, 3, 1 << 20, 7},
		{8, 8, 8, 100 << 10},
	}
	for _, ns := range sizes {
		items := make([][]byte, len(ns))
		for i, n := range ns {
			items[i] = bytes.Repeat([]byte{byte(i + 1)}, n)
		}
		want, err := EncodeReply(42, nil, items)
		if err != nil {
			t.Fatal(err)
		}
		pieces, err := EncodeBinsReply(42, items)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Join(pieces, nil); !bytes.Equal(got, want) {
			t.Fatalf("sizes %v: pieces differ from EncodeReply (%d bytes, want %d)", ns, len(got), len(want))
		}
		for i, it := range items {
			if len(it) >= binPieceMin && !hasPiece(pieces, it) {
				t.Fatalf("sizes %v: item %d (%d bytes) was copied, not written as it is", ns, i, len(it))
			}
		}
	}
}

func hasPiece(pieces [][]byte, it []byte) bool {
	for _, p := range pieces {
		if len(p) == len(it) && &p[0] == &it[0] {
			return true
		}
	}
	return false
}
