package config

import (
	"strings"
	"testing"
)

// TestErrorsNameTheFieldPath: a misspelt or mistyped field is reported by its path in the file,
// with the field it was likely meant to be.
func TestErrorsNameTheFieldPath(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"misspelt nested field", "pool:\n  healthChek:\n    interval: 5s\n", `pool.healthChek: unknown field "healthChek" (did you mean healthCheck?)`},
		{"misspelt top-level field", "poool: {}\n", `poool: unknown field "poool" (did you mean pool?)`},
		{"misspelt deep field", "pool:\n  healthCheck:\n    intervall: 5s\n", `pool.healthCheck.intervall: unknown field "intervall" (did you mean interval?)`},
		{"field in a list", "plugins:\n- name: max-score-picker\n  wieght: 1\n", `plugins[0].wieght: unknown field "wieght" (did you mean weight?)`},
		{"nothing alike", "extProc:\n  zzzzzzzz: 1\n", `extProc.zzzzzzzz: unknown field "zzzzzzzz" (known: `},
		{"duration as a number", "pool:\n  healthCheck:\n    interval: 5\n", `pool.healthCheck.interval: want a duration string such as "30s", got 5`},
		{"duration that does not parse", "pool:\n  healthCheck:\n    timeout: soon\n", `pool.healthCheck.timeout: invalid duration "soon"`},
		{"first word shared", "extProc:\n  chunkSize: 5\n", `extProc.chunkSize: unknown field "chunkSize" (did you mean chunkBytes?)`},
		{"wrong type", "extProc:\n  maxBodyBytes: lots\n", "extProc.maxBodyBytes: want int64, got string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestFieldNamesMatchAsEncodingJSONDoes: the check accepts what the decoder accepts (field names
// match case-insensitively), so no file that loaded before is refused now.
func TestFieldNamesMatchAsEncodingJSONDoes(t *testing.T) {
	c, err := Parse([]byte("Pool:\n  HealthCheck:\n    Interval: 3s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Pool.HealthCheck.Interval.D().String() != "3s" {
		t.Fatalf("interval %v", c.Pool.HealthCheck.Interval.D())
	}
}
