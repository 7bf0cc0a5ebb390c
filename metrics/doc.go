// Package metrics is the daemon's Prometheus instrumentation and its HTTP
// endpoint (`syncmgr serve --metrics ADDR`).
//
// Counters and histograms that events move (connections, handshakes, ops,
// hold times) are updated by the server through the nil-safe methods of
// *Metrics, so a daemon without --metrics pays one nil check per event.
// Gauges of current state (sessions, objects and waiters by kind, shared
// memory) are read from a Source at scrape time, so nothing is kept in step
// by hand. Label values come from fixed sets (transports, kinds and ops of
// the op table, wire error codes), with one exception: the per-queue series
// carry the queue's name, for the MaxQueueSeries deepest queues only, so no
// client can grow the number of series.
//
// The endpoint serves /metrics and /healthz. /healthz answers "ok" and
// nothing else, without authentication. The endpoint listens on loopback
// unless the operator allows other addresses explicitly.
package metrics
