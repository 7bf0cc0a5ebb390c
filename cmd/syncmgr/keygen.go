package main

import (
	"encoding/hex"
	"fmt"

	"github.com/syncmgr/syncmgr/auth"
)

func runKeygen(args []string) error {
	fs := newFlagSet("keygen", "keygen",
		"Print a fresh random 32-byte authkey as 64 hex digits.",
		"Give it to the daemon and its clients as $SYNCMGR_AUTHKEY, or in a 0600 file named by\n$SYNCMGR_AUTHKEY_FILE. In Python, pass it to syncmgr.connect() as the str printed\nhere (or as bytes.fromhex(...)).")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	k, err := auth.NewKey()
	if err != nil {
		return err
	}
	fmt.Println(hex.EncodeToString(k))
	return nil
}
