package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dustin/go-humanize"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
)

func runStatus(ctx context.Context, args []string) error {
	fs := newFlagSet("status", "status [flags]",
		"List the objects, clients, waiters and shared-memory segments of a running daemon.",
		"The authkey comes from --authkey-file, else $SYNCMGR_AUTHKEY (hex), else the file\nnamed by $SYNCMGR_AUTHKEY_FILE.")
	addr := fs.String("address", defaultAddress(), "daemon address: a socket path or tcp://host:port; $SYNCMGR_ADDRESS when set, else the daemon's default socket")
	keyFile := fs.String("authkey-file", "", "file holding the authkey as hex (unset: $SYNCMGR_AUTHKEY, then the file named by $SYNCMGR_AUTHKEY_FILE)")
	limit := fs.Int("limit", 1000, "list at most this many objects; the others are counted in a line below the table")
	tlsCA := fs.String("tls-ca", os.Getenv("SYNCMGR_TLS_CA"), "TLS: CA file to trust for a tcp:// address, which turns TLS on; $SYNCMGR_TLS_CA when set")
	tlsCert := fs.String("tls-cert", os.Getenv("SYNCMGR_TLS_CERT"), "TLS: client certificate (PEM); $SYNCMGR_TLS_CERT when set")
	tlsKey := fs.String("tls-key", os.Getenv("SYNCMGR_TLS_KEY"), "TLS: client private key (PEM); $SYNCMGR_TLS_KEY when set")
	tlsName := fs.String("tls-server-name", os.Getenv("SYNCMGR_TLS_SERVER_NAME"), "TLS: name to check the server's certificate against; $SYNCMGR_TLS_SERVER_NAME when set, else the address's host")
	asJSON := fs.Bool("json", false, "print one JSON document (server, objects, sessions, waiting, shared_memory) instead of tables")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	key, found, err := auth.LoadKey(*keyFile)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: no authkey: set SYNCMGR_AUTHKEY (hex, as `syncmgr keygen` prints it) or SYNCMGR_AUTHKEY_FILE, or pass --authkey-file", errUsage)
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
	if errors.Is(err, auth.ErrAuthFailed) {
		return fmt.Errorf("%w (the key came from %s)", err, auth.KeySource(*keyFile))
	}
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Call(ctx, "status", map[string]any{"limit": *limit}, nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	st, _ := res.(map[string]any)
	if st == nil {
		return fmt.Errorf("status: unexpected reply %T", res)
	}
	if sh, err := c.Call(ctx, "shm_list", nil, nil); err == nil {
		st["shared_memory"] = sh
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(jsonable(st))
	}
	return printStatus(os.Stdout, st)
}

// printStatus writes the status as tables for a person at a terminal. Every
// string that came from the daemon (and so, possibly, from a client: labels,
// names, states) goes through clean, so no client can write control
// characters or fake lines to the operator's terminal.
func printStatus(out io.Writer, st map[string]any) error {
	srv, _ := st["server"].(map[string]any)
	fmt.Fprintf(out, "syncmgr %s  pid %s  up %s  %s connections  %s objects  %s sessions  rss %s  %s goroutines\n\n",
		str(srv["version"]), str(srv["pid"]), duration(srv["uptime"]), str(srv["connections"]), str(srv["objects"]),
		str(srv["sessions"]), size(srv["rss"]), str(srv["goroutines"]))

	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tNAME\tSTATE\tHELD FOR\tWAITERS\tREFS")
	for _, o := range list(st["objects"]) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", str(o["kind"]), str(o["name"]), str(o["state"]),
			duration(o["held_for"]), str(o["waiters"]), str(o["refs"]))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if n, ok := toInt(srv["objects_omitted"]); ok && n > 0 {
		fmt.Fprintf(out, "(%d more objects not listed; see --limit)\n", n)
	}

	labels := map[string]string{}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SESSION\tPID\tCONNS\tHOLDS\tLABEL")
	for _, s := range list(st["sessions"]) {
		labels[str(s["id"])] = str(s["label"])
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", str(s["id"]), str(s["pid"]), str(s["conns"]), str(s["holds"]), str(s["label"]))
	}
	if err := w.Flush(); err != nil {
		return err
	}

	if waits := list(st["waiting"]); len(waits) > 0 {
		sort.SliceStable(waits, func(i, j int) bool { return num(waits[i]["for"]) > num(waits[j]["for"]) })
		fmt.Fprintln(out)
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "WAITING\tSESSION\tLABEL\tON\tOP\tFOR")
		for i, x := range waits {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s %s\t%s\t%s\n", i+1, str(x["session"]), labels[str(x["session"])],
				str(x["kind"]), str(x["name"]), str(x["op"]), duration(x["for"]))
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}

	if sh, ok := st["shared_memory"].(map[string]any); ok {
		limit := "no cap"
		if n, _ := toInt(sh["limit"]); n > 0 {
			limit = "a cap of " + size(sh["limit"])
		}
		fmt.Fprintf(out, "\nshared memory: %s in use, %s, in %s\n", size(sh["used"]), limit, str(sh["dir"]))
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SEGMENT\tSIZE\tCREATOR\tATTACHED\tAGE")
		for _, s := range list(sh["segments"]) {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", str(s["name"]), size(s["size"]), str(s["creator"]),
				str(s["attached"]), duration(s["age"]))
		}
		return w.Flush()
	}
	return nil
}

// clean makes a string from the daemon safe to print: returned as it is when
// every rune is printable (spaces included), else quoted with Go escapes, so
// that newlines, tabs, terminal escapes, bidi overrides and invalid UTF-8 show
// as \n, \t, \x1b, \u202e, \xff instead of acting on the terminal.
func clean(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || r == '\\' || r == '"' || (!unicode.IsPrint(r) && r != ' ') {
			return strconv.Quote(s)
		}
	}
	return s
}

// str formats one value of the reply for a table cell.
func str(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		return clean(x)
	case []byte:
		return clean(string(x))
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(x), 'f', -1, 32)
	default:
		return clean(fmt.Sprint(x))
	}
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), true
	case float64:
		return int64(x), true
	}
	return 0, false
}

func num(v any) float64 {
	if f, ok := v.(float64); ok {
		return f
	}
	if f, ok := v.(float32); ok {
		return float64(f)
	}
	n, _ := toInt(v)
	return float64(n)
}

// size formats a byte count as "1.0 MiB".
func size(v any) string {
	n, ok := toInt(v)
	if !ok || n < 0 {
		return "-"
	}
	return humanize.IBytes(uint64(n))
}

// duration formats seconds as "250ms", "12s", "3m20s", "5h2m".
func duration(v any) string {
	if v == nil {
		return "-"
	}
	d := time.Duration(num(v) * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

// jsonable turns a decoded msgpack reply into values encoding/json accepts
// (maps with string keys; bytes as strings).
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case []byte:
		return string(x)
	default:
		return x
	}
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
