package main

import (
	"io"
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
