package main

import (
	"strings"
	"testing"
)

func TestBadFlagsAreRejectedWithTheFlagsName(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "fastest"}, "--policy"},
		{[]string{"--mode", "BUFFERED_PARTIAL"}, "--mode"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--policy", "round-robin"}, "needs endpoints"},
		{[]string{"--policy", "random", "--endpoints", "model-0:8000"}, "want ip:port"},
		{[]string{"--status-on-error", "42"}, "status on error"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}
