package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
)

func runStatus(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	addr := fs.String("address", defaultAddress(), "daemon address: a socket path or tcp://host:port (default $SYNCMGR_ADDRESS)")
	keyFile := fs.String("authkey-file", "", "file holding the authkey as hex (default $SYNCMGR_AUTHKEY)")
	limit := fs.Int("limit", 1000, "list at most this many objects")
	tlsCA := fs.String("tls-ca", os.Getenv("SYNCMGR_TLS_CA"), "TLS: CA file to trust for a tcp:// address (default $SYNCMGR_TLS_CA; TLS is used when set)")
	tlsCert := fs.String("tls-cert", os.Getenv("SYNCMGR_TLS_CERT"), "TLS: client certificate (PEM) (default $SYNCMGR_TLS_CERT)")
	tlsKey := fs.String("tls-key", os.Getenv("SYNCMGR_TLS_KEY"), "TLS: client private key (PEM) (default $SYNCMGR_TLS_KEY)")
	tlsName := fs.String("tls-server-name", os.Getenv("SYNCMGR_TLS_SERVER_NAME"), "TLS: name to check the server's certificate against (default $SYNCMGR_TLS_SERVER_NAME, else the host)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	key, found, err := auth.LoadKey(*keyFile)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: no authkey: set SYNCMGR_AUTHKEY or pass --authkey-file", errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts := []proxy.Option{proxy.WithLabel("syncmgr status")}
	if *tlsCA != "" {
		cfg, err := clientTLS(*tlsCA, *tlsCert, *tlsKey, *tlsName)
		if err != nil {
			return err
		}
		opts = append(opts, proxy.WithTLS(cfg))
	}
	c, err := proxy.Dial(ctx, *addr, key, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Call(ctx, "status", map[string]any{"limit": *limit}, nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	st, _ := res.(map[string]any)
	srv, _ := st["server"].(map[string]any)
	rss, _ := srv["rss"].(int64)
	fmt.Printf("syncmgr %v  pid %v  up %.0fs  %v connections  %v objects  %v sessions  rss %.1f MiB  %v goroutines\n\n",
		srv["version"], srv["pid"], srv["uptime"], srv["connections"], srv["objects"], srv["sessions"], float64(rss)/(1<<20), srv["goroutines"])
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tNAME\tSTATE\tWAITERS\tREFS")
	for _, o := range list(st["objects"]) {
		fmt.Fprintf(w, "%v\t%v\t%v\t%v\t%v\n", o["kind"], o["name"], o["state"], o["waiters"], o["refs"])
	}
	w.Flush()
	if n, _ := srv["objects_omitted"].(int64); n > 0 {
		fmt.Printf("(%d more objects not listed; see --limit)\n", n)
	}
	fmt.Println()
	w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SESSION\tPID\tCONNS\tHOLDS\tLABEL")
	for _, s := range list(st["sessions"]) {
		fmt.Fprintf(w, "%v\t%v\t%v\t%v\t%v\n", s["id"], s["pid"], s["conns"], s["holds"], s["label"])
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if res, err := c.Call(ctx, "shm_list", nil, nil); err == nil {
		sh, _ := res.(map[string]any)
		fmt.Printf("\nshared memory: %v bytes in use of %v (0: no cap) in %v\n", sh["used"], sh["limit"], sh["dir"])
		w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SEGMENT\tSIZE\tCREATOR\tATTACHED\tAGE")
		for _, s := range list(sh["segments"]) {
			fmt.Fprintf(w, "%v\t%v\t%v\t%v\t%.0fs\n", s["name"], s["size"], s["creator"], s["attached"], s["age"])
		}
		return w.Flush()
	}
	return nil
}

func list(x any) []map[string]any {
	xs, _ := x.([]any)
	out := make([]map[string]any, 0, len(xs))
	for _, v := range xs {
		if m, ok := v.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func defaultAddress() string {
	if a := os.Getenv("SYNCMGR_ADDRESS"); a != "" {
		return a
	}
	return server.DefaultSocketPath()
}

// clientTLS builds the TLS settings of a client from file names.
func clientTLS(ca, cert, key, name string) (*tls.Config, error) {
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca: no certificate in %s", ca)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
