// Command devgateway is a development HTTP gateway that plays the data plane (Envoy's ext_proc
// filter and ORIGINAL_DST cluster) in front of the kvpick picker, so the whole path runs on one
// machine without Envoy. It is a development tool, not a production proxy: see internal/devgateway.
//
//	devgateway --picker 127.0.0.1:9002 --listen 127.0.0.1:8080
//	devgateway --policy round-robin --endpoints 127.0.0.2:8000,127.0.0.3:8000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvpick/kvpick/internal/devgateway"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "devgateway:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("devgateway", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP listen address")
	picker := fs.String("picker", "127.0.0.1:9002", "the picker's ext_proc address (policy picker)")
	pickerTLS := fs.Bool("picker-tls", true, "connect to the picker over TLS, accepting any certificate (the picker's default is self-signed)")
	policy := fs.String("policy", string(devgateway.PolicyPicker), "picker, round-robin or random (the last two bypass ext_proc and use --endpoints)")
	endpoints := fs.String("endpoints", "", "model servers as ip:port,ip:port (policies round-robin and random)")
	mode := fs.String("mode", devgateway.ModeFullDuplex, "ext_proc body mode: full-duplex, buffered or streamed")
	retryOnReset := fs.Bool("retry-on-reset", true, "also try the next fallback when a connection is reset before any response header (Envoy retry_on reset)")
	connectTimeout := fs.Duration("connect-timeout", 2*time.Second, "timeout of one connection attempt to a model server")
	upstreamTimeout := fs.Duration("upstream-timeout", 10*time.Minute, "timeout of one upstream attempt, response body included (Envoy's route timeout)")
	messageTimeout := fs.Duration("message-timeout", 30*time.Second, "ext_proc message_timeout")
	statusOnError := fs.Int("status-on-error", 503, "status when the ext_proc stream fails or the picker is unreachable (Envoy's status_on_error; 504 on a deadline)")
	maxBody := fs.Int64("max-body-bytes", 64<<20, "largest request body accepted (413 above)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var level zapcore.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", *logLevel)
	}
	pol, err := devgateway.ParsePolicy(*policy)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	m, err := devgateway.ParseMode(*mode)
	if err != nil {
		return fmt.Errorf("--mode: %w", err)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.Sampling = nil
	log, err := zc.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	o := devgateway.Options{
		Policy: pol, Mode: m, RetryOnReset: *retryOnReset,
		ConnectTimeout: *connectTimeout, UpstreamTimeout: *upstreamTimeout, MessageTimeout: *messageTimeout,
		StatusOnError: *statusOnError, MaxBodyBytes: *maxBody, Log: log,
	}
	if *endpoints != "" {
		o.Endpoints = strings.Split(*endpoints, ",")
	}
	if pol == devgateway.PolicyPicker {
		conn, err := devgateway.DialPicker(*picker, *pickerTLS)
		if err != nil {
			return fmt.Errorf("--picker: %w", err)
		}
		defer conn.Close()
		o.Picker = conn
	}
	g, err := devgateway.New(o)
	if err != nil {
		return err
	}
	defer g.Close()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("devgateway serving", zap.Stringer("listen", ln.Addr()), zap.String("policy", string(pol)),
		zap.String("picker", *picker), zap.String("mode", *mode))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
