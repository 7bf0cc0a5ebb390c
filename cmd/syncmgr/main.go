// Command syncmgr is the syncmgr daemon and its command-line tools.
//
//	syncmgr serve    run the daemon
//	syncmgr keygen   print a fresh authkey (hex)
//	syncmgr status   list the objects and clients of a running daemon
//	syncmgr version  print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `syncmgr: a coordination server for Python and Go processes

Usage:
  syncmgr serve   [flags]   run the daemon (see 'syncmgr serve -h')
  syncmgr keygen            print a fresh 32-byte authkey as hex
  syncmgr status  [flags]   list objects and clients of a running daemon
  syncmgr version           print the version
  syncmgr ray-start --name N   start a daemon on every node of a running Ray cluster
  syncmgr ray-stop  --name N   stop them (both: the Python package's syncmgr command)

'syncmgr COMMAND -h' describes a command and its flags; a flag takes one dash or
two (-socket and --socket are the same).

The authkey is read from --authkey-file, else $SYNCMGR_AUTHKEY (hex), else the
file named by $SYNCMGR_AUTHKEY_FILE. It is never taken from the command line.
`

// errUsage marks errors that are the caller's words being off (exit 2).
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signalContext()
	defer stop()
	err := run(ctx, os.Args[1:])
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "syncmgr:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "syncmgr:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("%w: no command given", errUsage)
	}
	switch args[0] {
	case "serve":
		return serveCommand(ctx, args[1:])
	case "keygen":
		return runKeygen(args[1:])
	case "status":
		return runStatus(ctx, args[1:])
	case "version", "--version", "-v":
		fs := newFlagSet("version", "version", "Print the version of this syncmgr binary.", "")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		fmt.Println("syncmgr", version)
		return nil
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	case "ray-start", "ray-stop":
		return fmt.Errorf("%w: %s speaks to Ray, so it is a command of the Python package's `syncmgr` (pip install "+
			"syncmgr, then run `syncmgr %s` from that environment, or `python -m syncmgr %s`)", errUsage, args[0],
			args[0], args[0])
	default:
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
	}
}

// signalContext is cancelled by the first SIGINT, SIGTERM or SIGHUP; a
// second one exits at once. SIGHUP (the terminal of `syncmgr serve &`
// closing) is a clean stop like SIGTERM: segments unlinked, socket removed.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		<-ch
		cancel()
		<-ch
		fmt.Fprintln(os.Stderr, "syncmgr: second signal, exiting now")
		os.Exit(1)
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}
