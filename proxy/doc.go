// Package proxy is the Go client of the syncmgr daemon.
//
// A Client is one authenticated connection (and one session: what it holds
// is released if it disconnects). It is safe for concurrent use: requests are
// multiplexed by id, so a goroutine blocked in Lock.Acquire does not stall
// the others. Every call that can block takes a context.Context; when the
// context ends the client cancels the request on the server and, if the
// grant raced in first, gives it back, so a cancelled call never leaves a
// lock taken or an item consumed.
//
//	c, err := proxy.Dial(ctx, "/run/user/1000/syncmgr.sock", key)
//	lock, err := c.Lock(ctx, "ingest")
//	if err := lock.Acquire(ctx); err != nil { ... }
//	defer lock.Release(ctx)
package proxy
