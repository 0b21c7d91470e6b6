package main

import (
	"io"
	"net"
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
