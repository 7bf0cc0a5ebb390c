package wire

import (
	"bytes"
	"testing"
	"unsafe"
)

func TestBinArgsAreSlicesOfTheFrame(t *testing.T) {
	item := bytes.Repeat([]byte{7}, 100_000)
	frame, err := EncodeRequest(5, "put", map[string]any{"kind": "queue", "name": "q", "item": item})
	if err != nil {
		t.Fatal(err)
	}
	body := frame[HeaderSize:]
	req, err := DecodeRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := req.Args.Bytes("item")
	if !bytes.Equal(got, item) {
		t.Fatal("item changed in decoding")
	}
	start := uintptr(unsafe.Pointer(&body[0]))
	p := uintptr(unsafe.Pointer(&got[0]))
	if p < start || p >= start+uintptr(len(body)) {
		t.Fatal("the item was copied out of the frame")
	}
	if cap(got) != len(got) {
		t.Fatal("an append to the item could write into the frame")
	}
}

func TestBinReplyHeadMatchesEncodeReply(t *testing.T) {
	item := bytes.Repeat([]byte{1, 2, 3}, 30_000)
	want, err := EncodeReply(9, nil, item)
	if err != nil {
		t.Fatal(err)
	}
	head, err := EncodeBinReplyHead(9, len(item))
	if err != nil {
		t.Fatal(err)
	}
	if got := append(head, item...); !bytes.Equal(got, want) {
		t.Fatal("head + item differs from the whole reply")
	}
}
