package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
)

// dashNote is printed once above every flag list: Go's flag package takes
// both forms, and the docs write the long one.
const dashNote = "Flags (one dash or two: -limit and --limit are the same):"

// newFlagSet is a subcommand's flag set whose -h starts with the command's
// synopsis and one line saying what it does (then about, if any), and shows
// each flag's default once (flag texts say where a default comes from, never
// the default itself).
func newFlagSet(name, synopsis, does, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: syncmgr %s\n\n%s\n", synopsis, does)
		if about != "" {
			fmt.Fprintf(out, "\n%s\n", about)
		}
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(out, "\n%s\n", dashNote)
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args into fs and refuses positional arguments: a
// usage error (exit 2) is one line that names what was wrong and where the
// help is; -h prints the help on stdout and ends with flag.ErrHelp (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	var out bytes.Buffer
	fs.SetOutput(&out) // the flag package prints the whole usage on any error: kept for -h only
	err := fs.Parse(args)
	fs.SetOutput(nil)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = out.WriteTo(os.Stdout)
			return err
		}
		return fmt.Errorf("%w: %v (see 'syncmgr %s -h')", errUsage, err, fs.Name())
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q (see 'syncmgr %s -h')", errUsage, fs.Arg(0), fs.Name())
	}
	return nil
}
