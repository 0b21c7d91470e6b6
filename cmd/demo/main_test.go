package main

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"testing"
)

func TestUnknownCommandIsRejected(t *testing.T) {
	for _, args := range [][]string{{"lod"}, {"load", "now"}, {"--log-level", "loud"}} {
		if err := run(args, io.Discard, io.Discard); err == nil || strings.Contains(err.Error(), "help") {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
	}
}

func TestBusyPortSuggestsListen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	err = run([]string{"--listen", addr, "--sims", "1"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--listen") || !strings.Contains(err.Error(), addr) ||
		!strings.Contains(err.Error(), "in use") {
		t.Fatalf("run with a busy --listen address: %v", err)
	}
}

// TestLoadProgressIsLinesWhenNotATerminal runs the comparison with stderr a pipe, as in CI:
// the progress must be plain lines, not a bar redrawn with carriage returns.
func TestLoadProgressIsLinesWhenNotATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo workload twice")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&stderr, r); close(copied) }()
	err = run([]string{"load", "--concurrency", "4", "--log-level", "error"}, io.Discard, w)
	w.Close()
	<-copied
	if err != nil {
		t.Fatal(err)
	}
	out := stderr.String()
	if strings.ContainsRune(out, '\r') {
		t.Errorf("carriage returns in the progress written to a pipe:\n%q", out)
	}
	for _, policy := range []string{"picker", "round-robin"} {
		if !strings.Contains(out, policy) || !strings.Contains(out, "requests") {
			t.Errorf("no progress line for %s:\n%s", policy, out)
		}
	}
}
