package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// Self-signed certificates (serve --tls-self-signed): a daemon started by a
// program on a cluster node, where nobody places a CA or certificate files,
// makes its own at start. It exists only in memory, for this run: clients
// pin its SHA-256 fingerprint (TLSFingerprint), which the daemon logs and
// writes to its --info-file for the program that started it.

// Validity of a self-signed certificate: back-dated for clocks behind the
// daemon's, and long enough that no running daemon outlives it.
const (
	selfSignedBackdate = time.Hour
	selfSignedValidity = 10 * 365 * 24 * time.Hour
)

// SelfSignedTLS returns a TLS server config holding a fresh ECDSA P-256 key
// and a self-signed certificate for host (the --tcp HOST: an IP address or
// a name; empty or unspecified adds this machine's hostname), plus
// 127.0.0.1, ::1 and localhost, and the certificate's fingerprint (see
// TLSFingerprint). Nothing is written anywhere.
func SelfSignedTLS(host string, now time.Time) (*tls.Config, string, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("self-signed certificate: key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, "", fmt.Errorf("self-signed certificate: serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "syncmgr"},
		NotBefore:             now.Add(-selfSignedBackdate),
		NotAfter:              now.Add(selfSignedValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	switch ip := net.ParseIP(host); {
	case ip != nil && !ip.IsUnspecified():
		if !ip.IsLoopback() {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		}
	case ip == nil && host != "" && host != "localhost":
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	default: // every address: the machine's name is the one that means it
		if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		return nil, "", fmt.Errorf("self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, "", fmt.Errorf("self-signed certificate: %w", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv, Leaf: leaf}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, TLSFingerprint(der), nil
}

// TLSFingerprint is the SHA-256 of a DER certificate as lowercase hex,
// without separators: what clients pin.
func TLSFingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}
