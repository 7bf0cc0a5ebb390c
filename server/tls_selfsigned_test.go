package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"slices"
	"testing"
	"time"
)

// TestSelfSignedTLS: the certificate made for --tls-self-signed is a P-256
// leaf for server auth, back-dated an hour and valid for years, named for
// the --tcp host and for loopback, and its fingerprint is the lowercase hex
// SHA-256 of its DER.
func TestSelfSignedTLS(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		host     string
		ip       string
		dns      string
		noExtras bool
	}{
		{host: "10.0.0.2", ip: "10.0.0.2"},
		{host: "node-7.cluster", dns: "node-7.cluster"},
		{host: "127.0.0.1", noExtras: true},
		{host: ""},
		{host: "0.0.0.0"},
	} {
		cfg, fp, err := SelfSignedTLS(tc.host, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(cfg.Certificates) != 1 || len(cfg.Certificates[0].Certificate) != 1 {
			t.Fatalf("%q: want one certificate", tc.host)
		}
		der := cfg.Certificates[0].Certificate[0]
		sum := sha256.Sum256(der)
		if fp != hex.EncodeToString(sum[:]) {
			t.Fatalf("%q: fingerprint %s is not the DER's SHA-256", tc.host, fp)
		}
		leaf := cfg.Certificates[0].Leaf
		pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
		if !ok || pub.Curve != elliptic.P256() {
			t.Fatalf("%q: key %T, want ECDSA P-256", tc.host, leaf.PublicKey)
		}
		if leaf.Subject.CommonName != "syncmgr" || leaf.IsCA {
			t.Fatalf("%q: subject %v, CA %v", tc.host, leaf.Subject, leaf.IsCA)
		}
		if !leaf.NotBefore.Before(now.Add(-59*time.Minute)) || leaf.NotAfter.Before(now.AddDate(9, 0, 0)) {
			t.Fatalf("%q: valid %v to %v", tc.host, leaf.NotBefore, leaf.NotAfter)
		}
		if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
			t.Fatalf("%q: %v", tc.host, err)
		}
		if err := leaf.VerifyHostname("localhost"); err != nil {
			t.Fatalf("%q: %v", tc.host, err)
		}
		if tc.ip != "" && !slices.ContainsFunc(leaf.IPAddresses, net.ParseIP(tc.ip).Equal) {
			t.Fatalf("%q: IP SANs %v", tc.host, leaf.IPAddresses)
		}
		if tc.dns != "" && !slices.Contains(leaf.DNSNames, tc.dns) {
			t.Fatalf("%q: DNS SANs %v", tc.host, leaf.DNSNames)
		}
		if tc.noExtras && (len(leaf.IPAddresses) != 2 || len(leaf.DNSNames) != 1) {
			t.Fatalf("%q: SANs %v %v, want loopback only", tc.host, leaf.IPAddresses, leaf.DNSNames)
		}
		again, fp2, err := SelfSignedTLS(tc.host, now)
		if err != nil || fp2 == fp || again.Certificates[0].PrivateKey == cfg.Certificates[0].PrivateKey {
			t.Fatalf("%q: a second certificate is not fresh (%v)", tc.host, err)
		}
	}
}
