package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/metrics"
	"github.com/syncmgr/syncmgr/shmregistry"
)

// metricsFlags are serve's flags for the Prometheus endpoint.
type metricsFlags struct {
	addr        *string
	allowRemote *bool
}

func addMetricsFlags(fs *flag.FlagSet) metricsFlags {
	return metricsFlags{
		addr:        fs.String("metrics", "", "serve Prometheus metrics on HOST:PORT at /metrics, and /healthz (off by default; loopback only unless --metrics-allow-remote)"),
		allowRemote: fs.Bool("metrics-allow-remote", false, "let --metrics listen on a non-loopback address (the endpoint has no authentication)"),
	}
}

// start returns nil Metrics when --metrics is not given, so that the server
// records nothing; otherwise it listens and logs the address. The returned
// stop closes the endpoint.
func (f metricsFlags) start(ctx context.Context, log zerolog.Logger) (*metrics.Metrics, func(), error) {
	if *f.addr == "" {
		if *f.allowRemote {
			return nil, nil, fmt.Errorf("%w: --metrics-allow-remote needs --metrics", errUsage)
		}
		return nil, func() {}, nil
	}
	m := metrics.New()
	s, err := metrics.Listen(ctx, *f.addr, *f.allowRemote, m)
	if errors.Is(err, metrics.ErrNotLoopback) {
		return nil, nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if err != nil {
		return nil, nil, err
	}
	ev := log.Info()
	if *f.allowRemote {
		ev = log.Warn().Str("security", "the metrics endpoint has no authentication and listens beyond loopback")
	}
	ev.Str("metrics", "http://"+s.Addr().String()+"/metrics").Msg("serving metrics")
	return m, func() { s.Close() }, nil
}

// stateSource reads the gauges' values at scrape time: objects and waiters
// by kind and sessions from the manager, segment bytes from the registry.
func stateSource(mgr *manager.Manager, shm *shmregistry.Registry) metrics.Source {
	return func() metrics.Snapshot {
		objs, sess := mgr.Snapshot(0)
		s := metrics.Snapshot{Sessions: len(sess), Objects: map[string]int{}, Waiters: map[string]int{},
			QueueItems: map[string]int64{}, QueueBytes: map[string]int64{}}
		for _, o := range objs {
			s.Objects[string(o.Kind)]++
			s.Waiters[string(o.Kind)] += o.Waiters
			if o.Kind == manager.KindQueue || o.Kind == manager.KindJoinableQueue {
				s.QueueItems[string(o.Kind)] += o.Items
				s.QueueBytes[string(o.Kind)] += o.Bytes
				s.Queues = append(s.Queues, metrics.QueueDepth{Kind: string(o.Kind), Name: o.Name, Items: o.Items,
					Bytes: o.Bytes, Waiters: o.Waiters})
			}
		}
		sort.Slice(s.Queues, func(i, j int) bool {
			a, b := s.Queues[i], s.Queues[j]
			if a.Items != b.Items {
				return a.Items > b.Items
			}
			if a.Bytes != b.Bytes {
				return a.Bytes > b.Bytes
			}
			return a.Name < b.Name
		})
		if len(s.Queues) > metrics.MaxQueueSeries {
			s.Queues = s.Queues[:metrics.MaxQueueSeries]
		}
		if shm != nil {
			s.ShmUsed, s.ShmLimit = shm.Usage()
			s.ShmSegments = len(shm.List())
		}
		return s
	}
}

// holdEnds observes hold times and logs, at info, each hold released because
// its holder's session ended: the operator's record of who died holding what.
func holdEnds(log zerolog.Logger, m *metrics.Metrics) func(manager.HoldEnd) {
	return func(h manager.HoldEnd) {
		kind := string(h.Kind)
		if h.Held >= 0 { // unknown for a hold taken on the fast path
			m.Held(kind, h.Held)
		}
		if !h.SessionEnded {
			return
		}
		ev := log.Info().Str("kind", kind).Str("name", h.Name).Uint64("session", h.Session.ID).Int("pid", h.Session.PID).
			Str("label", h.Label)
		if h.Held >= 0 {
			ev = ev.Float64("held_seconds", h.Held.Seconds())
		}
		ev.Msg("released a hold of a client that went away")
		// Counted once logged: whoever sees the count move finds the line.
		m.DeadHolderRelease(kind)
	}
}
