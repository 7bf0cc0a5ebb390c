package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// runInfo is what `serve --info-file` writes once every listener is up: how
// the program that started the daemon (a node's supervisor) learns the port
// it got for --tcp HOST:0 and the fingerprint its clients pin.
type runInfo struct {
	PID       int    `json:"pid"`
	Socket    string `json:"socket"`     // the Unix socket's absolute path; "" without one
	TCP       string `json:"tcp"`        // the TCP address bound (HOST:PORT); "" without TCP
	TLSSHA256 string `json:"tls_sha256"` // lowercase hex SHA-256 of the DER certificate; "" without TLS
	Run       string `json:"run"`        // this run's id, as in the handshake's welcome
	Version   string `json:"version"`
}

// writeInfoFile writes info to path atomically (a temporary file in the
// same directory, then a rename), mode 0600. A symbolic link or anything
// but a regular file at path is refused, not followed or replaced.
func writeInfoFile(path string, info runInfo) error {
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("--info-file %s: refusing to replace a %s", path, kindOf(fi.Mode()))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--info-file: %w", err)
	}
	body, err := json.Marshal(info)
	if err != nil {
		return err
	}
	body = append(body, '\n')
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*") // 0600
	if err != nil {
		return fmt.Errorf("--info-file: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(body)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--info-file: %w", err)
	}
	return nil
}

// removeInfoFile removes the info file at a graceful stop, unless another
// daemon has written its own there since (its run id differs).
func removeInfoFile(path, run string) error {
	body, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var got runInfo
	if json.Unmarshal(bytes.TrimSpace(body), &got) != nil || got.Run != run {
		return nil
	}
	return os.Remove(path)
}

func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m.IsDir():
		return "directory"
	}
	return "non-regular file"
}
