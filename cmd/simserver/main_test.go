package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRunServesAndShutsDown starts the binary's run loop on a free port,
// serves a request, and checks a cancelled context (SIGINT/SIGTERM in
// main) ends it cleanly.
func TestRunServesAndShutsDown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--addr", "127.0.0.1:0", "--model", "m", "--decode-ms-per-token", "0.1",
			"--log-level", "warn"}, io.Discard, func(a string) { addrc <- a })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || body.Usage.CompletionTokens != 3 || resp.Header.Get("x-served-by") != addr {
		t.Fatalf("status %d, err %v, body %+v, served by %q", resp.StatusCode, err, body, resp.Header.Get("x-served-by"))
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no shutdown")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--num-gpu-blocks", "0"},
		{"--error-rate", "2"},
		{"--log-level", "loud"},
		{"extra"},
	} {
		if err := run(context.Background(), args, io.Discard, nil); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
