package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/internal/fsafe"
	"github.com/syncmgr/syncmgr/internal/gcfloor"
	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/server"
	"github.com/syncmgr/syncmgr/shmregistry"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

const version = server.Version

// serveConfig is serve's command line: serveFlags fills it from the flags,
// validate checks it and completes it (absolute paths, the socket's
// permissions, the segments' cap), and runServe runs the daemon it
// describes.
type serveConfig struct {
	socket        string
	tcpAddr       string
	keyFile       string
	logLevel      string
	logFormat     string
	maxFrame      int
	tlsCert       string
	tlsKey        string
	tlsSelf       bool
	infoFile      string
	insecure      bool
	allowOthers   bool
	sockGroup     string
	shareGrace    time.Duration
	maxPerClient  int
	maxObjects    int
	maxQueue      int64
	maxConns      int
	maxObjBytes   int64
	maxBytes      int64
	maxParked     int64
	eventLoops    int
	loopMinConns  int
	maxPeerConns  int
	maxUnauth     int
	hsTimeout     time.Duration
	parentPID     int
	shutdownGrace time.Duration
	shmDir        string
	fastDir       string
	fastObjects   int
	ringBytes     int64
	shmLimit      string
	gcFloor       int64
	metrics       metricsFlags

	// Set by validate.
	unixOpts server.UnixOptions
	limit    int64 // the segments' cap in bytes (0 with --shm-dir none)
}

// serveFlags returns serve's flag set, which fills the returned config as
// it parses.
func serveFlags() (*flag.FlagSet, *serveConfig) {
	fs := newFlagSet("serve", "serve [flags]",
		"Run the daemon: named Locks, Queues, Events, Values, ... and shared memory for Python and Go clients.",
		"The authkey comes from --authkey-file, else $SYNCMGR_AUTHKEY (hex), else the file\nnamed by $SYNCMGR_AUTHKEY_FILE; make one with 'syncmgr keygen'. It is never\ntaken from the command line.")
	def := manager.DefaultConfig()
	c := &serveConfig{}
	fs.StringVar(&c.socket, "socket", server.DefaultSocketPath(), "Unix socket path (\"\" or \"none\" to disable)")
	fs.StringVar(&c.tcpAddr, "tcp", "", "also listen on TCP HOST:PORT (unset: no TCP; unencrypted unless --tls-cert or --tls-self-signed is given; port 0: any free port, see --info-file)")
	fs.StringVar(&c.keyFile, "authkey-file", "", "file holding the authkey as hex (unset: $SYNCMGR_AUTHKEY, then the file named by $SYNCMGR_AUTHKEY_FILE)")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.logFormat, "log-format", "console", "log format: console or json")
	fs.IntVar(&c.maxFrame, "max-frame", wire.DefaultMaxFrame, "largest message in bytes")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "TLS certificate (PEM) for --tcp")
	fs.StringVar(&c.tlsKey, "tls-key", "", "TLS private key (PEM) for --tcp")
	fs.BoolVar(&c.tlsSelf, "tls-self-signed", false, "with --tcp: serve TLS with a certificate made at start, in memory only; clients pin its SHA-256 fingerprint (logged as tls_sha256, and in --info-file)")
	fs.StringVar(&c.infoFile, "info-file", "", "once listening, write PATH (JSON, mode 0600): pid, socket, tcp (the address bound), tls_sha256, run, version; removed at a graceful stop")
	fs.BoolVar(&c.insecure, "insecure", false, "allow --tcp without TLS on an address other than loopback (frames after the handshake are NOT authenticated)")
	fs.BoolVar(&c.allowOthers, "allow-other-users", false, "accept Unix-socket clients running as another user (they still need the key); the socket becomes 0666, or 0660 with --socket-group")
	fs.StringVar(&c.sockGroup, "socket-group", "", "with --allow-other-users: only this group (name or gid) may connect; the socket is 0660 and owned by it")
	fs.DurationVar(&c.shareGrace, "share-grace", def.ShareGrace, "how long a shared (pickled) anonymous object outlives its last reference")
	fs.IntVar(&c.maxPerClient, "max-objects-per-client", def.MaxObjectsPerSession, "live objects one client (a process on a Unix socket, a source address over TCP) may have created")
	fs.IntVar(&c.maxObjects, "max-objects", def.MaxObjects, "objects the daemon holds at most")
	fs.Int64Var(&c.maxQueue, "max-queue", def.MaxQueue, "largest queue maxsize")
	fs.IntVar(&c.maxConns, "max-conns", 8192, "authenticated connections at once")
	fs.Int64Var(&c.maxObjBytes, "max-object-bytes", def.MaxObjectBytes, "bytes one queue (with waiting puts), dict or list may hold; each item counts 64 bytes more")
	fs.Int64Var(&c.maxBytes, "max-bytes", def.MaxBytes, "bytes all queues, dicts and lists may hold together")
	fs.Int64Var(&c.maxParked, "max-parked", server.DefaultMaxParked, "requests one client may have waiting at once")
	fs.IntVar(&c.eventLoops, "event-loops", 0, "event loops serving Unix, TCP and TLS connections after their handshake (0: half the CPUs the daemon may use, at least one; -1: a thread of execution per connection instead)")
	fs.IntVar(&c.loopMinConns, "event-loop-min-conns", server.DefaultEventLoopMinConns, "Unix and plain TCP connections the daemon has before the event loops serve its Unix connections and their threads run under SCHED_BATCH (below it each Unix connection has a thread of execution of its own, which answers a lone client sooner; plain TCP connections are served by the loops from the first)")
	fs.IntVar(&c.maxPeerConns, "max-conns-per-client", server.DefaultMaxConnsPerPeer, "connections one client (a process on a Unix socket, a source address over TCP) may have at once")
	fs.IntVar(&c.maxUnauth, "max-handshakes", 128, "connections in the handshake at once, for Unix and for TCP each; over it one of the busiest source is dropped (a wrong key first, then the oldest silent one, then the one that has left the daemon's hello unanswered longest, once for 50ms; until then a newcomer waits)")
	fs.DurationVar(&c.hsTimeout, "handshake-timeout", 5*time.Second, "deadline on a connection's handshake")
	fs.IntVar(&c.parentPID, "exit-with-parent", 0, "shut down when the process with this pid is no longer our parent")
	fs.DurationVar(&c.shutdownGrace, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown may take")
	fs.StringVar(&c.shmDir, "shm-dir", "/dev/shm", "directory (tmpfs) for shared-memory segments; \"none\" disables the registry")
	fs.StringVar(&c.fastDir, "fastpath-dir", "", "\"none\" keeps every client on the socket; any other value is ignored (the fast path's state segment is an anonymous memory file)")
	fs.IntVar(&c.fastObjects, "fastpath-objects", 16384, "objects whose state the fast path's segment holds (64 bytes each); others stay on the socket path")
	fs.Int64Var(&c.ringBytes, "queue-ring-bytes", manager.DefaultQueueRingBytes, "data bytes of each Queue's shared ring on the fast path: a power of two from 64 KiB to 1 GiB; memory is used only as items touch it, and items over a quarter of it go through the daemon")
	fs.StringVar(&c.shmLimit, "shm-limit", "50%", "cap on all segments together: bytes (with K, M, G suffix) or a percentage of --shm-dir's size")
	fs.Int64Var(&c.gcFloor, "gc-floor", 32<<20, "bytes the daemon's heap may grow by before the Go collector runs, however small the live heap (large queue items are garbage once delivered; GOGC applies above it, GOMEMLIMIT still bounds it; 0: GOGC alone)")
	c.metrics = addMetricsFlags(fs)
	return fs, c
}

// serveCommand is 'syncmgr serve': its flags, then the daemon.
func serveCommand(ctx context.Context, args []string) error {
	// The daemon ignores SIGPIPE (the other commands keep Go's default, so
	// `syncmgr status | head` ends quietly): its log goes to stderr, often a
	// pipe to the process that started it (an embedded daemon's manager, a
	// Ray actor). When that process dies, the default would kill the daemon
	// on its next log line (the shutdown's own), before it unlinks its
	// segments; ignored, the write fails with EPIPE and the shutdown goes on.
	signal.Ignore(syscall.SIGPIPE)
	fs, c := serveFlags()
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return runServe(ctx, c)
}

// validate checks the flags' values and what they name (the socket's
// group, the segments' file system), making the paths absolute; its
// errors are usage errors but for those of the system it asked.
func (c *serveConfig) validate() error {
	if c.maxFrame < 1024 || c.maxFrame > 1<<30 {
		return fmt.Errorf("%w: --max-frame must be between 1024 and 1 GiB", errUsage)
	}
	if c.gcFloor < 0 || c.gcFloor > 1<<40 {
		return fmt.Errorf("%w: --gc-floor must be between 0 and 1 TiB", errUsage)
	}
	if c.ringBytes < 64<<10 || c.ringBytes > 1<<30 || c.ringBytes&(c.ringBytes-1) != 0 {
		return fmt.Errorf("%w: --queue-ring-bytes must be a power of two from 64 KiB to 1 GiB", errUsage)
	}
	if c.tlsSelf && (c.tlsCert != "" || c.tlsKey != "") {
		return fmt.Errorf("%w: --tls-self-signed and --tls-cert/--tls-key exclude each other: give one or the other", errUsage)
	}
	if c.tlsSelf && c.tcpAddr == "" {
		return fmt.Errorf("%w: --tls-self-signed needs --tcp HOST:PORT", errUsage)
	}
	if c.infoFile != "" {
		abs, err := filepath.Abs(c.infoFile)
		if err != nil {
			return fmt.Errorf("--info-file: %w", err)
		}
		c.infoFile = abs
	}
	if c.sockGroup != "" {
		if !c.allowOthers {
			return fmt.Errorf("%w: --socket-group needs --allow-other-users", errUsage)
		}
		gid, err := lookupGroup(c.sockGroup)
		if err != nil {
			return err
		}
		c.unixOpts.Group = gid
	} else if c.allowOthers {
		c.unixOpts.World = true
	}
	if c.socket != "" && c.socket != "none" {
		abs, err := filepath.Abs(c.socket) // pickled addresses must work from any directory
		if err != nil {
			return fmt.Errorf("socket path: %w", err)
		}
		c.socket = abs
	}
	if c.shmDir != "none" {
		limit, err := parseLimit(c.shmLimit, c.shmDir)
		if err != nil {
			return err
		}
		c.limit = limit
	}
	return nil
}

// runServe runs the daemon c describes until ctx ends (a signal), a
// listener fails or the parent it was told to exit with is gone.
func runServe(ctx context.Context, c *serveConfig) error {
	log, err := newLogger(c.logLevel, c.logFormat)
	if err != nil {
		return err
	}
	mtr, stopMetrics, err := c.metrics.start(ctx, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	key, found, err := auth.LoadKey(c.keyFile)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: no authkey: set SYNCMGR_AUTHKEY to a hex key or SYNCMGR_AUTHKEY_FILE to a key file, or pass --authkey-file; make one with:\n  export SYNCMGR_AUTHKEY=$(syncmgr keygen)", errUsage)
	}
	if err := auth.CheckKey(key); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if f := auth.KeyFile(c.keyFile); f != "" {
		if mode, loose := auth.LooseMode(f); loose {
			log.Warn().Str("file", f).Str("mode", fmt.Sprintf("%04o", mode)).
				Msg("the authkey file can be read or written by other users; chmod 600 it")
		}
	}
	if err := c.validate(); err != nil {
		return err
	}
	defer gcfloor.Start(uint64(c.gcFloor))()

	// Take the addresses first: a daemon refused here (another one holds
	// them) must not touch anything of the live one, its segments included.
	lns, boundTCP, fingerprint, err := listen(log, c)
	if err != nil {
		return err
	}
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()

	var shm *shmregistry.Registry
	if c.shmDir != "none" {
		shm, err = openShm(log, c.shmDir, c.socket, c.tcpAddr, c.limit, c.parentPID > 0)
		if err != nil {
			return err
		}
		defer shm.Close() // a graceful stop unlinks every segment
	}
	mcfg := manager.Config{ShareGrace: c.shareGrace, MaxObjectsPerSession: c.maxPerClient, MaxObjects: c.maxObjects, MaxQueue: c.maxQueue,
		MaxObjectBytes: c.maxObjBytes, MaxBytes: c.maxBytes, QueueRingBytes: c.ringBytes,
		MaxItemBytes: int64(c.maxFrame) - 64} // a ring's items all fit a reply (the envelope is under 64 bytes)
	mcfg.OnHoldEnd = holdEnds(log, mtr)
	mgr := manager.New(mcfg)
	if c.fastDir != "none" {
		// The same-host fast path (package statemem). Without it every
		// client uses the socket, which is correct, only slower. The
		// segment is an anonymous sealed memfd handed to clients over the
		// socket: no file to name, plant, or leave behind.
		seg, err := statemem.Create(c.fastObjects + 1)
		if err != nil {
			log.Warn().Err(err).Msg("fast path disabled")
		} else {
			mgr.EnableFastPath(seg) // mapped until exit: no goroutine can touch unmapped words
		}
	}
	mtr.SetSource(stateSource(mgr, shm))
	srv, err := server.New(server.Config{Key: key, MaxFrame: uint32(c.maxFrame), HandshakeTimeout: c.hsTimeout,
		MaxUnauthenticated: c.maxUnauth, MaxConns: c.maxConns, MaxParked: c.maxParked, MaxConnsPerPeer: c.maxPeerConns,
		AllowOtherUsers: c.allowOthers, Logger: log, Shm: shm, Metrics: mtr, EventLoops: c.eventLoops, EventLoopMinConns: c.loopMinConns}, mgr)
	if err != nil {
		return err
	}

	errc := make(chan error, len(lns)+2) // the listeners, watchParent, the info file
	for _, ln := range lns {
		go func(ln net.Listener) { errc <- srv.Serve(ln) }(ln)
	}
	if c.parentPID > 0 {
		go watchParent(ctx, c.parentPID, errc)
	}
	if c.infoFile != "" {
		sockPath := ""
		if c.socket != "none" {
			sockPath = c.socket
		}
		info := runInfo{PID: os.Getpid(), Socket: sockPath, TCP: boundTCP, TLSSHA256: fingerprint, Run: srv.RunID(), Version: version}
		if err := writeInfoFile(c.infoFile, info); err != nil {
			errc <- err // stop as on a failed listener: the supervisor waits for a file that will not come
		} else {
			defer func() {
				if err := removeInfoFile(c.infoFile, srv.RunID()); err != nil {
					log.Warn().Err(err).Str("file", c.infoFile).Msg("cannot remove the info file")
				}
			}()
			log.Info().Str("file", c.infoFile).Msg("info file written")
		}
	}
	log.Info().Str("version", version).Int("pid", os.Getpid()).Msg("syncmgr ready")
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info().Msg("signal received; shutting down")
	case serveErr = <-errc:
		if serveErr != nil {
			log.Error().Err(serveErr).Msg("listener failed; shutting down")
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn().Err(err).Msg("shutdown incomplete")
	}
	log.Info().Msg("stopped")
	return serveErr
}

// listen takes the Unix socket and the TCP address c names, returning the
// listeners, the TCP address bound and the TLS certificate's fingerprint
// (""s without TCP, TLS). On an error it closes what it took.
func listen(log zerolog.Logger, c *serveConfig) (lns []net.Listener, boundTCP, fingerprint string, err error) {
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	if c.socket != "" && c.socket != "none" {
		ln, err := server.ListenUnixWith(c.socket, c.unixOpts)
		if err != nil {
			return nil, "", "", err
		}
		lns = append(lns, ln)
		if c.allowOthers {
			warnUnreachable(log, c.socket)
		}
		log.Info().Str("socket", c.socket).Bool("other_users", c.allowOthers).Msg("listening")
	}
	if c.tcpAddr != "" {
		var tcfg *tls.Config
		if c.tlsCert != "" || c.tlsKey != "" {
			cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
			if err != nil {
				closeAll()
				return nil, "", "", fmt.Errorf("load tls key pair: %w", err)
			}
			tcfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			fingerprint = server.TLSFingerprint(cert.Certificate[0])
		}
		if c.tlsSelf {
			host, _, err := net.SplitHostPort(c.tcpAddr)
			if err != nil {
				closeAll()
				return nil, "", "", fmt.Errorf("%w: --tcp %s: %v", errUsage, c.tcpAddr, err)
			}
			if tcfg, fingerprint, err = server.SelfSignedTLS(host, time.Now()); err != nil {
				closeAll()
				return nil, "", "", err
			}
		}
		if tcfg == nil && !c.insecure && !loopbackOnly(c.tcpAddr) {
			closeAll()
			return nil, "", "", fmt.Errorf("%w: --tcp %s without TLS: off loopback a relay on the path could rewrite replies after the handshake (and Python clients unpickle them); give --tls-cert/--tls-key or --tls-self-signed, or --insecure on a network you trust", errUsage, c.tcpAddr)
		}
		ln, err := server.ListenTCP(c.tcpAddr, tcfg)
		if err != nil {
			closeAll()
			return nil, "", "", err
		}
		lns = append(lns, ln)
		ev := log.Info()
		if tcfg == nil {
			ev = log.Warn().Str("security", "plaintext TCP: the handshake is authenticated, but later frames are neither encrypted nor authenticated; use --tls-cert/--tls-key across untrusted networks")
		}
		boundTCP = ln.Addr().String()
		ev = ev.Str("tcp", boundTCP).Bool("tls", tcfg != nil)
		if fingerprint != "" {
			ev = ev.Str("tls_sha256", fingerprint).Bool("self_signed", c.tlsSelf)
		}
		ev.Msg("listening")
	}
	if len(lns) == 0 {
		return nil, "", "", fmt.Errorf("%w: nothing to listen on: give --socket or --tcp", errUsage)
	}
	return lns, boundTCP, fingerprint, nil
}

// openShm opens the shared-memory registry once the addresses are ours.
// A daemon on a fixed address keeps its manifest beside its socket (or, with
// TCP only, in the user's private directory) and adopts what its previous
// run made there. An embedded daemon (--exit-with-parent) is never restarted
// on its private address: it records its segments under the user's run
// directory, and every daemon starting removes those of embedded daemons
// that are dead.
func openShm(log zerolog.Logger, dir, socket, tcp string, limit int64, ephemeral bool) (*shmregistry.Registry, error) {
	runs := filepath.Join(server.UserDir(), "syncmgr-runs")
	if removed, err := shmregistry.Sweep(runs); err != nil {
		log.Warn().Err(err).Str("dir", runs).Msg("cannot look for segments of dead embedded daemons")
	} else if len(removed) > 0 {
		log.Info().Int("segments", len(removed)).Msg("removed shared-memory segments of dead embedded daemons")
	}
	o := shmregistry.Options{Dir: dir, Limit: limit}
	switch {
	case ephemeral:
		o.StateDir, o.Ephemeral = runs, true
	case socket != "" && socket != "none":
		o.StateDir, o.Name = filepath.Dir(socket), filepath.Base(socket)
	default:
		sum := sha256.Sum256([]byte(tcp))
		o.StateDir, o.Name = server.UserDir(), "tcp-"+hex.EncodeToString(sum[:8])
	}
	shm, rep, err := shmregistry.Open(o)
	for i := 0; errors.Is(err, fsafe.ErrLocked) && i < 30; i++ {
		time.Sleep(100 * time.Millisecond) // the previous daemon on this address is still closing its registry
		shm, rep, err = shmregistry.Open(o)
	}
	if err != nil {
		return nil, err
	}
	for _, r := range rep.Refused {
		log.Warn().Str("segment", r).Msg("not adopting a shared-memory segment of the previous run")
	}
	if len(rep.Adopted) > 0 {
		log.Warn().Int("segments", len(rep.Adopted)).Str("dir", dir).Msg("adopted shared-memory segments left by a previous run on this address")
	}
	return shm, nil
}

// loopbackOnly says whether a HOST:PORT listens on loopback only.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// lookupGroup returns the gid of a group name or number.
func lookupGroup(g string) (int, error) {
	if gid, err := strconv.Atoi(g); err == nil && gid > 0 {
		return gid, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("%w: --socket-group: %v", errUsage, err)
	}
	return strconv.Atoi(grp.Gid)
}

// warnUnreachable warns when the socket's directory does not let other
// users reach the socket (--allow-other-users on, e.g., $XDG_RUNTIME_DIR).
func warnUnreachable(log zerolog.Logger, socket string) {
	fi, err := os.Stat(filepath.Dir(socket))
	if err == nil && fi.Mode().Perm()&0o011 == 0 {
		log.Warn().Str("dir", filepath.Dir(socket)).Str("mode", fmt.Sprintf("%04o", fi.Mode().Perm())).
			Msg("--allow-other-users: other users cannot reach the socket through this directory; use --socket in a directory the daemon creates")
	}
}

// watchParent reports on errc (with a nil error) once pid is no longer our
// parent, so an embedded daemon does not outlive the program that started it.
func watchParent(ctx context.Context, pid int, errc chan<- error) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if os.Getppid() != pid {
				errc <- nil
				return
			}
		}
	}
}

func newLogger(level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("%w: --log-level must be debug, info, warn or error", errUsage)
	}
	var log zerolog.Logger
	switch format {
	case "json":
		log = zerolog.New(os.Stderr)
	case "console":
		fi, _ := os.Stderr.Stat()
		tty := fi != nil && fi.Mode()&os.ModeCharDevice != 0
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly, NoColor: !tty})
	default:
		return zerolog.Logger{}, fmt.Errorf("%w: --log-format must be console or json", errUsage)
	}
	return log.Level(lvl).With().Timestamp().Logger(), nil
}

// parseLimit reads a size such as "512M", "2G", "1073741824" or "50%" (of
// the filesystem holding dir).
func parseLimit(s, dir string) (int64, error) {
	s = strings.TrimSpace(s)
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		p, err := strconv.ParseFloat(pct, 64)
		if err != nil || p <= 0 || p > 100 {
			return 0, fmt.Errorf("%w: --shm-limit percentage must be in (0, 100]", errUsage)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return 0, fmt.Errorf("statfs %s: %w", dir, err)
		}
		return int64(float64(st.Blocks) * float64(st.Bsize) * p / 100), nil
	}
	mult := int64(1)
	for suf, m := range map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40} {
		if v, ok := strings.CutSuffix(strings.ToUpper(s), suf); ok {
			s, mult = v, m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: --shm-limit must be bytes (K/M/G/T suffix allowed) or a percentage", errUsage)
	}
	return n * mult, nil
}
