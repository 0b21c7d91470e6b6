package certs

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSelfSignedServesLoopbackForAYear(t *testing.T) {
	c, err := SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Leaf.VerifyHostname("localhost"); err != nil {
		t.Fatal(err)
	}
	if c.Leaf.NotAfter.Before(time.Now().Add(300 * 24 * time.Hour)) {
		t.Fatalf("expires %v", c.Leaf.NotAfter)
	}
}

func TestLoadReadsTheOperatorsPairAndNamesTheFlag(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "--cert-path") {
		t.Fatalf("missing files: %v", err)
	}
	c, err := SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tls.crt", "CERTIFICATE", c.Certificate[0])
	write("tls.key", "PRIVATE KEY", key)
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Certificate) != 1 {
		t.Fatalf("%d certificates", len(got.Certificate))
	}
}
