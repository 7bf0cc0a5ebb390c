package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ErrNotLoopback is returned by Listen for an address other than loopback
// when remote scrapes are not allowed.
var ErrNotLoopback = errors.New("is not a loopback address; the metrics endpoint is unauthenticated, " +
	"so other addresses need --metrics-allow-remote")

// CheckAddress returns an error unless addr (HOST:PORT) listens on loopback
// only, or allowRemote is set. An empty host means every interface.
func CheckAddress(ctx context.Context, addr string, allowRemote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--metrics %q: want HOST:PORT: %w", addr, err)
	}
	if allowRemote {
		return nil
	}
	if host == "" {
		return fmt.Errorf("--metrics %q (every interface) %w", addr, ErrNotLoopback)
	}
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return fmt.Errorf("--metrics %s %w", addr, ErrNotLoopback)
		}
		return nil
	}
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("--metrics %q: resolve %s: %w", addr, host, err)
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("--metrics %s (%s) %w", addr, ip, ErrNotLoopback)
		}
	}
	return nil
}

// Handler serves /metrics (the registry in the Prometheus text format) and
// /healthz ("ok"); everything else is 404.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Server is a running metrics endpoint.
type Server struct {
	ln  net.Listener
	srv *http.Server
	err chan error
}

// Listen checks addr (see CheckAddress), listens on it and serves the
// endpoint until Close.
func Listen(ctx context.Context, addr string, allowRemote bool, m *Metrics) (*Server, error) {
	if err := CheckAddress(ctx, addr, allowRemote); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	s := &Server{ln: ln, err: make(chan error, 1), srv: &http.Server{Handler: m.Handler(),
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}}
	go func() { s.err <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the endpoint listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the endpoint, letting scrapes in flight finish for up to a second.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.err; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
