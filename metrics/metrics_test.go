package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/metrics"
)

func scrape(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestEndpointServesCountersGaugesAndHealth(t *testing.T) {
	m := metrics.New()
	m.SetSource(func() metrics.Snapshot {
		return metrics.Snapshot{Sessions: 3, Objects: map[string]int{"lock": 2, "queue": 1},
			Waiters: map[string]int{"lock": 1}, ShmUsed: 4096, ShmLimit: 1 << 20, ShmSegments: 1,
			Queues: []metrics.QueueDepth{{Kind: "queue", Name: "jobs", Items: 7, Bytes: 700, Waiters: 2}}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := metrics.Listen(ctx, "127.0.0.1:0", false, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	base := "http://" + s.Addr().String()

	m.ConnOpened(metrics.TransportUnix)
	m.ConnOpened(metrics.TransportUnix)
	m.ConnClosed(metrics.TransportUnix)
	m.Op("lock", "acquire", "ok")
	m.Op("lock", "acquire", "ok")
	m.Op("queue", "get", "empty")
	m.Held("lock", 3*time.Millisecond)
	m.HandshakeFailed(metrics.TransportTCP, "auth")
	m.Refused(metrics.TransportTCP, "busy")
	m.DeadHolderRelease("lock")

	code, body := scrape(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	for _, want := range []string{
		`syncmgr_connections{transport="unix"} 1`,
		`syncmgr_connections_total{transport="unix"} 2`,
		`syncmgr_ops_total{kind="lock",op="acquire",result="ok"} 2`,
		`syncmgr_ops_total{kind="queue",op="get",result="empty"} 1`,
		`syncmgr_hold_seconds_count{kind="lock"} 1`,
		`syncmgr_handshake_failures_total{reason="auth",transport="tcp"} 1`,
		`syncmgr_connections_refused_total{reason="busy",transport="tcp"} 1`,
		`syncmgr_dead_holder_releases_total{kind="lock"} 1`,
		`syncmgr_sessions 3`,
		`syncmgr_objects{kind="lock"} 2`,
		`syncmgr_waiters{kind="lock"} 1`,
		`syncmgr_shm_bytes 4096`,
		`syncmgr_shm_limit_bytes 1.048576e+06`,
		`syncmgr_shm_segments 1`,
		`syncmgr_queue_depth_items{kind="queue",name="jobs"} 7`,
		`syncmgr_queue_depth_bytes{kind="queue",name="jobs"} 700`,
		`syncmgr_queue_waiters{kind="queue",name="jobs"} 2`,
		`go_goroutines `,
		`process_resident_memory_bytes `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	code, body = scrape(t, base+"/healthz")
	if code != http.StatusOK || body != "ok\n" {
		t.Fatalf("GET /healthz: %d %q, want 200 \"ok\\n\" and nothing else", code, body)
	}
	if code, _ = scrape(t, base+"/"); code != http.StatusNotFound {
		t.Fatalf("GET /: %d, want 404", code)
	}
}

func TestNilMetricsDoNothing(t *testing.T) {
	var m *metrics.Metrics
	m.ConnOpened("unix")
	m.ConnClosed("unix")
	m.Op("lock", "acquire", "ok")
	m.Held("lock", time.Second)
	m.HandshakeFailed("tcp", "auth")
	m.Refused("tcp", "busy")
	m.DeadHolderRelease("lock")
	m.SetSource(nil)
}

func TestEndpointIsLoopbackUnlessAllowed(t *testing.T) {
	ctx := context.Background()
	for _, addr := range []string{"127.0.0.1:0", "[::1]:9464", "localhost:9464"} {
		if err := metrics.CheckAddress(ctx, addr, false); err != nil {
			t.Errorf("CheckAddress(%q) = %v, want nil", addr, err)
		}
	}
	for _, addr := range []string{":9464", "0.0.0.0:9464", "[::]:9464", "192.0.2.1:9464"} {
		err := metrics.CheckAddress(ctx, addr, false)
		if !errors.Is(err, metrics.ErrNotLoopback) || !strings.Contains(err.Error(), "--metrics-allow-remote") {
			t.Errorf("CheckAddress(%q) = %v, want ErrNotLoopback naming the flag", addr, err)
		}
		if err := metrics.CheckAddress(ctx, addr, true); err != nil {
			t.Errorf("CheckAddress(%q, allowRemote) = %v", addr, err)
		}
		if _, err := metrics.Listen(ctx, addr, false, metrics.New()); !errors.Is(err, metrics.ErrNotLoopback) {
			t.Errorf("Listen(%q) = %v, want a refusal before listening", addr, err)
		}
	}
	if err := metrics.CheckAddress(ctx, "no-port", false); err == nil {
		t.Error("CheckAddress without a port: nil error")
	}
}

func TestQueueSeriesAreBounded(t *testing.T) {
	m := metrics.New()
	qs := make([]metrics.QueueDepth, metrics.MaxQueueSeries+50)
	for i := range qs {
		qs[i] = metrics.QueueDepth{Kind: "queue", Name: fmt.Sprintf("q%d", i), Items: int64(len(qs) - i)}
	}
	m.SetSource(func() metrics.Snapshot { return metrics.Snapshot{Queues: qs} })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := metrics.Listen(ctx, "127.0.0.1:0", false, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	_, body := scrape(t, "http://"+s.Addr().String()+"/metrics")
	if n := strings.Count(body, "syncmgr_queue_depth_items{"); n != metrics.MaxQueueSeries {
		t.Fatalf("%d per-queue series, want at most %d", n, metrics.MaxQueueSeries)
	}
}
