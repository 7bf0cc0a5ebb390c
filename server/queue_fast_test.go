package server_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// queue_attach passes a Queue's ring to a Unix-socket client with
// SCM_RIGHTS: an anonymous file sealed against resizing, of the announced
// size, whose records are the items socket clients put. A kind that does
// not match the queue, a JoinableQueue for a client that does not keep its
// task counts ("tasks"), a TCP client and an unknown queue are refused.
func TestQueueAttachPassesASealedRing(t *testing.T) {
	ts, _ := startFastServer(t)

	c := ts.raw(t, []byte("queue-session"))
	c.send(1, wire.OpCreate, map[string]any{"kind": "queue", "name": "rq"})
	c.recv()
	c.send(2, wire.OpPut, map[string]any{"kind": "queue", "name": "rq", "item": []byte("from the socket")})
	if rep := c.recv(); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	c.send(3, wire.OpQueueAttach, map[string]any{"kind": "queue", "name": "rq"})
	buf, oob := make([]byte, 4096), make([]byte, 256)
	_ = c.nc.SetReadDeadline(time.Now().Add(bound))
	n, oobn, _, _, err := c.nc.(*net.UnixConn).ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cmsgs) != 1 {
		t.Fatalf("control messages %v %v", cmsgs, err)
	}
	fds, err := unix.ParseUnixRights(&cmsgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights %v %v", fds, err)
	}
	fd := fds[0]
	defer unix.Close(fd)
	body, err := wire.ReadFrame(bytes.NewReader(buf[:n]), wire.DefaultMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := wire.DecodeReply(body)
	if err != nil || rep.Err != nil {
		t.Fatalf("attach reply %+v %v", rep, err)
	}
	info := rep.Result.(map[string]any)
	size := asInt(t, info["size"])
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != size {
		t.Fatalf("ring file size %d, announced %d (%v)", st.Size, size, err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if err != nil || seals&want != want {
		t.Fatalf("seals %#x (%v), want %#x", seals, err, want)
	}
	if err := unix.Ftruncate(fd, size*2); err == nil {
		t.Fatal("the ring could be grown")
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if binary.LittleEndian.Uint64(mem) != statemem.RingMagic {
		t.Fatal("bad ring magic")
	}
	tail, head := binary.LittleEndian.Uint64(mem[80:]), binary.LittleEndian.Uint64(mem[88:])
	if tail>>40-head>>40 != 1 {
		t.Fatalf("ring holds %d items, want the socket put's 1", tail>>40-head>>40)
	}
	rec := mem[statemem.RingHeader:]
	if l := binary.LittleEndian.Uint32(rec); string(rec[8:8+l]) != "from the socket" {
		t.Fatalf("record %q", rec[8:8+l])
	}

	// Refusals.
	c.send(4, wire.OpCreate, map[string]any{"kind": "joinable_queue", "name": "jq"})
	c.recv()
	for i, args := range []map[string]any{{"kind": "queue", "name": "jq"}, {"kind": "queue", "name": "nope"},
		{"kind": "joinable_queue", "name": "jq"}} { // (a client that does not say it keeps the task counts)
		c.send(uint64(10+i), wire.OpQueueAttach, args)
		if rep := c.recv(); rep.Err == nil {
			t.Fatalf("attach %v accepted", args)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.Serve(ln)
	nc, err := net.DialTimeout("tcp", ln.Addr().String(), bound)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(bound))
	if _, err := auth.Client(nc, auth.ClientConfig{Key: testKey, Label: "tcp"}); err != nil {
		t.Fatal(err)
	}
	tcp := &rawConn{t: t, nc: nc}
	tcp.send(1, wire.OpQueueAttach, map[string]any{"kind": "queue", "name": "rq"})
	if rep := tcp.recv(); rep.Err == nil || rep.Err.Code != wire.CodeUnknownOp {
		t.Fatalf("TCP attach: %+v", rep)
	}
}

// A get_many from a session that has the queue's ring takes its first item
// and leaves the rest to be read from shared memory (its client asks only
// when the ring had nothing for it): 1 MiB arrays copied out of the ring
// into replies cost a remote producer's local consumer three copies each.
// A session without the ring still gets the whole batch in one reply.
func TestGetManyForARingHolderTakesTheFirstItem(t *testing.T) {
	ts, _ := startFastServer(t)

	holder, other := ts.raw(t, []byte("ring-holder")), ts.raw(t, []byte("socket-only"))
	holder.send(1, wire.OpCreate, map[string]any{"kind": "queue", "name": "bq"})
	holder.recv()
	holder.send(2, wire.OpQueueAttach, map[string]any{"kind": "queue", "name": "bq"})
	if rep := holder.recv(); rep.Err != nil { // (a plain read: the kernel closes the passed descriptor)
		t.Fatal(rep.Err)
	}
	item := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 100<<10) }
	for i := 0; i < 4; i++ {
		other.send(uint64(10+i), wire.OpPut, map[string]any{"kind": "queue", "name": "bq", "item": item(i)})
		if rep := other.recv(); rep.Err != nil {
			t.Fatal(rep.Err)
		}
	}
	getMany := func(c *rawConn, id uint64) []any {
		c.send(id, wire.OpGetMany, map[string]any{"kind": "queue", "name": "bq", "n": 10, "block": false})
		rep := c.recv()
		if rep.Err != nil {
			t.Fatal(rep.Err)
		}
		items, _ := rep.Result.([]any)
		return items
	}
	if got := getMany(holder, 20); len(got) != 1 || !bytes.Equal(got[0].([]byte), item(0)) {
		t.Fatalf("the ring holder got %d items, want the first alone", len(got))
	}
	got := getMany(other, 21)
	if len(got) != 3 {
		t.Fatalf("a socket-only session got %d items, want the other 3", len(got))
	}
	for i, it := range got {
		if !bytes.Equal(it.([]byte), item(i+1)) {
			t.Fatalf("item %d out of order", i+1)
		}
	}
}
