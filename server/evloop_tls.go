package server

import (
	"crypto/tls"
	"net"
	"sync"
)

// TLS connections in an event loop. A loop serves a TLS connection as it
// serves a plain one, with crypto/tls between the socket and the frames:
//
//   - Reading. The loop reads through the tls.Conn, whose net.Conn (the
//     sniffConn under it) reads the non-blocking socket by a raw read(2)
//     and answers "would block" with a temporary net.Error. crypto/tls
//     keeps what it has of a record and answers the same error: that is
//     how it survives a read deadline. Records crypto/tls holds are not
//     seen by epoll, so the loop reads on until the tls.Conn would block,
//     and a connection stopped before that (tlsTurn bytes or tlsTurnReads
//     reads in one turn, a read that left a KeyUpdate's answer, or
//     outLimit bytes of replies waiting) is read again later
//     (evLoop.again), as is one just adopted (evLoop.kick).
//   - Writing. A reply is sealed under conn.wmu by tls.Conn.Write, whose
//     records the sniffConn keeps (loopState.keep) instead of writing;
//     they then take the plain path: written at once as far as the socket
//     takes them, the rest in the connection's output queue with the
//     reply's grant. A reply of more than sealPiece bytes is queued as
//     plaintext and sealed a piece at a time as the socket drains
//     (sealAhead), at most sealTurn bytes per flush of its connection: its
//     records are never all in memory at once, and sealing 64 MiB (about
//     50 ms) no longer keeps the loop from its other connections. Records
//     are sealed in the order they are sent (a record's sequence number is
//     in its nonce), so while such a reply waits, every later reply waits
//     as plaintext behind it, and is sealed, whole, together with the
//     replies after it, once the one ahead of it has been (they then go
//     out in one writev, as before).
//   - A TLS 1.3 KeyUpdate with update_requested is answered by crypto/tls
//     from inside Read, in the loop's goroutine, which does not hold wmu
//     then (a writer holding wmu may wait for crypto/tls's output lock,
//     which that Read holds). Its record waits in the sniffConn behind the
//     records sealed before it and ahead of those sealed after it (all
//     are sealed under crypto/tls's output lock): the next reply takes it
//     along, or the loop queues it after the Read, or, while plaintext
//     waits to be sealed, the next piece sealed takes it along.

// tlsTurn is how many plaintext bytes, and tlsTurnReads how many reads
// (each at most one record's plaintext), the loop takes from one TLS
// connection before it turns to the others: a peer of many tiny records
// gets no longer turns than one of a few large ones.
const (
	tlsTurn      = 128 << 10
	tlsTurnReads = 64
)

// loopState is a sniffConn's state once its connection is in an event
// loop: the socket's descriptor (the loop's duplicate) and the records
// crypto/tls wrote that are still to be queued for the socket.
type loopState struct {
	fd int
	// drained: the last read took less than it could, so the socket had
	// nothing more then; the loop's goroutine only (see read).
	drained bool
	mu      sync.Mutex
	out     []byte
}

// enterLoop puts c in loop mode and returns its loop state: from now on
// it reads fd and keeps what it is asked to write. c's own socket must be
// closed by the caller.
func (c *sniffConn) enterLoop(fd int) *loopState {
	c.loop = &loopState{fd: fd}
	return c.loop
}

// read reads the socket once, without waiting. Once a read in this turn
// has drained the socket, it answers would-block with no system call:
// crypto/tls asks for more only when what it holds ends mid-record, and
// bytes that arrived since make the socket readable for the loop's next
// wait (level-triggered). A turn begins with a read of the socket
// (newTurn).
func (s *loopState) read(b []byte) (int, error) {
	if s.drained && len(b) > 0 {
		return 0, errWouldBlock
	}
	n, err := readNB(uintptr(s.fd), b)
	if err == nil {
		s.drained = n < len(b)
	}
	return n, err
}

// newTurn has the next read ask the socket.
func (s *loopState) newTurn() { s.drained = false }

// keep takes a record crypto/tls wrote (under its output lock).
func (s *loopState) keep(b []byte) {
	s.mu.Lock()
	s.out = append(s.out, b...)
	s.mu.Unlock()
}

// take returns the records kept so far, in the order they were sealed.
func (s *loopState) take() []byte {
	s.mu.Lock()
	b := s.out
	s.out = nil
	s.mu.Unlock()
	return b
}

// reuse gives back a buffer take returned, once its bytes are written.
func (s *loopState) reuse(b []byte) {
	s.mu.Lock()
	if s.out == nil && cap(b) <= maxReused {
		s.out = b[:0]
	}
	s.mu.Unlock()
}

// reserve makes room for n more bytes of records.
func (s *loopState) reserve(n int) {
	s.mu.Lock()
	if cap(s.out)-len(s.out) < n {
		grown := make([]byte, len(s.out), len(s.out)+n)
		copy(grown, s.out)
		s.out = grown
	}
	s.mu.Unlock()
}

// kept reports whether records wait to be queued.
func (s *loopState) kept() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.out) > 0
}

// maxReused is the largest record buffer kept for the next reply.
const maxReused = 64 << 10

// sealPiece is the most plaintext sealed at once for a reply, and
// sealTurn how many bytes of plaintext one flush of a connection seals
// before the loop turns to its other connections (the socket, still
// writable, brings it back the next round). A reply counts as at least
// sealSmall, so a flush seals at most sealTurn/sealSmall replies.
const (
	sealPiece = 256 << 10
	sealTurn  = 2 * sealPiece
	sealSmall = 1 << 10
)

// sealOverhead bounds what records add to n bytes of plaintext: a 5-byte
// header, a content type byte and a 16-byte tag per record, and records
// of at least about 1 KiB (crypto/tls's smallest, while a connection is
// new).
func sealOverhead(n int) int { return n/32 + 64 }

// sendTLSLocked seals bufs into records and sends them as one reply (under
// c.wmu); see sendLocked.
func (lp *loopConn) sendTLSLocked(c *conn, bufs [][]byte, done func(bool)) (queued bool, err error) {
	if lp.closed {
		return false, net.ErrClosed
	}
	st := lp.st
	size := 0
	for _, b := range bufs {
		size += len(b)
	}
	if size > sealPiece || lp.sealing() {
		// Sealed as the socket drains, behind what waits (flush, sealAhead).
		lp.out = append(lp.out, outChunk{plain: append([][]byte(nil), bufs...), fd: -1, done: done})
		lp.outBytes += size
		if !lp.corked {
			lp.rearm(c)
		}
		return true, nil
	}
	st.reserve(size + sealOverhead(size))
	for _, b := range bufs {
		if _, err := lp.tc.Write(b); err != nil {
			return false, err
		}
	}
	rec := st.take()
	queued, err = lp.sendLocked(c, [][]byte{rec}, -1, done)
	if !queued {
		st.reuse(rec)
	}
	return queued, err
}

// sealing reports whether plaintext waits in c's output queue to be
// sealed (under c.wmu). Such replies are always its last: once one is
// queued, every later reply is queued as plaintext behind it, and they
// are sealed from the first on (sealAhead).
func (lp *loopConn) sealing() bool {
	return len(lp.out) > 0 && len(lp.out[len(lp.out)-1].plain) > 0
}

// sealAhead seals, in the queue's order, the next piece of the plaintext
// at the head of c's output queue (whose sealed bytes are all written),
// and once that reply is sealed whole, the replies after it, until budget
// bytes of plaintext are sealed (under c.wmu). Each reply's records go in
// its own chunk, which is then ready to write with the others. It returns
// the plaintext bytes sealed, each reply counting as at least sealSmall.
func (lp *loopConn) sealAhead(budget int) (int, error) {
	done := 0
	for i := range lp.out {
		ch := &lp.out[i]
		if len(ch.plain) == 0 {
			continue // sealed already (only ever ahead of the first with plaintext)
		}
		if done >= budget {
			break
		}
		n, err := lp.sealNext(ch)
		if err != nil {
			return done, err
		}
		done += max(n, sealSmall)
		if len(ch.plain) > 0 {
			break // the rest of it when this piece is written
		}
	}
	return done, nil
}

// sealNext seals the next piece of ch's plaintext, at most sealPiece
// bytes, into ch.bufs (under c.wmu; every reply ahead of ch sealed, and
// nothing of ch left to write), and returns the plaintext bytes sealed.
// Records crypto/tls wrote by itself meanwhile (a KeyUpdate's answer,
// which sendKept leaves while plaintext waits) come first, as they were
// sealed.
func (lp *loopConn) sealNext(ch *outChunk) (int, error) {
	left := 0
	for _, b := range ch.plain {
		left += len(b)
	}
	left = min(left, sealPiece)
	lp.st.reserve(left + sealOverhead(left))
	piece := 0
	for piece < sealPiece && len(ch.plain) > 0 {
		b := ch.plain[0]
		k := min(len(b), sealPiece-piece)
		if _, err := lp.tc.Write(b[:k]); err != nil {
			return piece, err
		}
		piece += k
		if k == len(b) {
			ch.plain = ch.plain[1:]
		} else {
			ch.plain[0] = b[k:]
		}
	}
	rec := lp.st.take()
	ch.bufs = [][]byte{rec}
	lp.outBytes += len(rec) - piece
	return piece, nil
}

// keptToSend reports whether records crypto/tls wrote by itself wait for
// sendKept to queue them: not while plaintext waits to be sealed, whose
// next piece takes them along.
func (lp *loopConn) keptToSend(c *conn) bool {
	if !lp.st.kept() {
		return false
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return !lp.sealing()
}

// sendKept queues the records crypto/tls wrote by itself (a KeyUpdate's
// answer) that no reply has taken along. While a reply's plaintext waits
// to be sealed it leaves them: they must go ahead of that reply's next
// records, and its next piece takes them along (sealNext).
func (lp *loopConn) sendKept(c *conn) {
	if !lp.st.kept() {
		return
	}
	c.wmu.Lock()
	if lp.closed || lp.sealing() {
		c.wmu.Unlock()
		return
	}
	_, err := lp.sendLocked(c, [][]byte{lp.st.take()}, -1, nil)
	c.wmu.Unlock()
	if err != nil {
		c.close()
	}
}

// backlogged reports whether the loop stops reading c's requests: outLimit
// bytes of replies wait for it, or one of its requests runs off the loop
// (offLoop).
func (lp *loopConn) backlogged(c *conn) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return lp.outBytes >= outLimit || lp.paused
}

// loopTLS returns the tls.Conn and sniffConn of a TLS connection a loop
// can serve, or nils.
func loopTLS(nc net.Conn) (*tls.Conn, *sniffConn) {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return nil, nil
	}
	sc, ok := tc.NetConn().(*sniffConn)
	if !ok {
		return nil, nil
	}
	if _, ok := sc.Conn.(*net.TCPConn); !ok {
		return nil, nil
	}
	return tc, sc
}
