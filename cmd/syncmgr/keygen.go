package main

import (
	"encoding/hex"
	"fmt"

	"github.com/syncmgr/syncmgr/auth"
)

func runKeygen(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: keygen takes no arguments", errUsage)
	}
	k, err := auth.NewKey()
	if err != nil {
		return err
	}
	fmt.Println(hex.EncodeToString(k))
	return nil
}
