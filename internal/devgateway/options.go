package devgateway

import (
	"crypto/tls"
	"fmt"
	"math"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvpick/kvpick/internal/dataplane"
)

// Policy is how the gateway chooses the model server.
type Policy string

// Policies.
const (
	// PolicyPicker asks the ext_proc picker (the default).
	PolicyPicker Policy = "picker"
	// PolicyRoundRobin cycles over Options.Endpoints without ext_proc.
	PolicyRoundRobin Policy = "round-robin"
	// PolicyRandom picks uniformly from Options.Endpoints without ext_proc.
	PolicyRandom Policy = "random"
)

// ParsePolicy parses a --policy value.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyPicker, PolicyRoundRobin, PolicyRandom:
		return p, nil
	}
	return "", fmt.Errorf("policy %q: want picker, round-robin or random", s)
}

// Mode names accepted by ParseMode.
const (
	ModeFullDuplex = "full-duplex"
	ModeBuffered   = "buffered"
	ModeStreamed   = "streamed"
)

// ParseMode maps a --mode value to the proxy's processing_mode.
//
//   - full-duplex: the reference wiring of docs/protocol.md (both bodies FULL_DUPLEX_STREAMED, every
//     header and trailer mode SEND). What inference gateways configure.
//   - buffered: request body BUFFERED (the picker routes on the body answer); response body
//     STREAMED so that SSE still flows chunk by chunk.
//   - streamed: request body STREAMED with send_body_without_waiting_for_header_response (the
//     only STREAMED setting in which a picker can read the body before routing); response body
//     STREAMED.
func ParseMode(s string) (dataplane.Mode, error) {
	switch s {
	case ModeFullDuplex:
		return dataplane.FullDuplex(), nil
	case ModeBuffered:
		return dataplane.Mode{
			RequestBody:     filterv3.ProcessingMode_BUFFERED,
			ResponseBody:    filterv3.ProcessingMode_STREAMED,
			ResponseHeaders: true,
		}, nil
	case ModeStreamed:
		return dataplane.Mode{
			RequestBody:                             filterv3.ProcessingMode_STREAMED,
			SendBodyWithoutWaitingForHeaderResponse: true,
			ResponseBody:                            filterv3.ProcessingMode_STREAMED,
			ResponseHeaders:                         true,
		}, nil
	}
	return dataplane.Mode{}, fmt.Errorf("mode %q: want %s, %s or %s", s, ModeFullDuplex, ModeBuffered, ModeStreamed)
}

// Options configure a Gateway. Zero values take the documented defaults.
type Options struct {
	// Policy: PolicyPicker (default), PolicyRoundRobin or PolicyRandom.
	Policy Policy
	// Picker is the gRPC connection to the picker (DialPicker). Required for PolicyPicker.
	Picker grpc.ClientConnInterface
	// Mode is the ext_proc processing mode; the zero Mode means dataplane.FullDuplex().
	Mode dataplane.Mode
	// Endpoints ("ip:port") for PolicyRoundRobin and PolicyRandom.
	Endpoints []string
	// RetryOnReset also tries the next fallback when a connection is reset (or closed) before
	// any response header arrived, as Envoy's retry_on "reset". Connection failures always move
	// on to the next fallback (retry_on "connect-failure"): that is what the list is for.
	RetryOnReset bool
	// ConnectTimeout bounds one connection attempt to a model server (default 2s). A server
	// that does not accept within it counts as a connection failure.
	ConnectTimeout time.Duration
	// UpstreamTimeout bounds one attempt's whole upstream request (Envoy's route timeout;
	// default 10m: long generations are normal). No response header by then is a 504.
	UpstreamTimeout time.Duration
	// MessageTimeout is the ext_proc message_timeout (default 30s: "a long message_timeout").
	MessageTimeout time.Duration
	// StatusOnError is the status a request gets when the ext_proc stream fails or the picker
	// cannot be reached (Envoy's status_on_error). Default 503: an unreachable picker is an
	// unavailable service, and clients retry 503. Envoy itself defaults to 500; a failure by
	// deadline is 504 either way.
	StatusOnError int
	// MaxBodyBytes bounds a request body (default 64 MiB, above the picker's own 32 MiB limit
	// so that the picker's 413 is the one clients see). Larger bodies get 413.
	MaxBodyBytes int64
	// Log receives the gateway's logs (default: none).
	Log *zap.Logger
}

func (o *Options) setDefaults() error {
	if o.Policy == "" {
		o.Policy = PolicyPicker
	}
	if _, err := ParsePolicy(string(o.Policy)); err != nil {
		return err
	}
	if o.Policy == PolicyPicker && o.Picker == nil {
		return fmt.Errorf("devgateway: policy picker needs a picker connection")
	}
	if o.Policy != PolicyPicker && len(o.Endpoints) == 0 {
		return fmt.Errorf("devgateway: policy %s needs endpoints", o.Policy)
	}
	for _, e := range o.Endpoints {
		if !validHostPort(e) {
			return fmt.Errorf("devgateway: endpoint %q: want ip:port", e)
		}
	}
	if o.Mode == (dataplane.Mode{}) {
		o.Mode = dataplane.FullDuplex()
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 2 * time.Second
	}
	if o.UpstreamTimeout <= 0 {
		o.UpstreamTimeout = 10 * time.Minute
	}
	if o.MessageTimeout <= 0 {
		o.MessageTimeout = 30 * time.Second
	}
	if o.StatusOnError == 0 {
		o.StatusOnError = 503
	}
	if o.StatusOnError < 200 || o.StatusOnError > 599 {
		return fmt.Errorf("devgateway: status on error %d: want 200..599", o.StatusOnError)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 64 << 20
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return nil
}

// DialPicker connects to the picker's ext_proc port. useTLS accepts any certificate: the
// picker's default is a self-signed one (Envoy's ext_proc cluster does the same). Reconnection
// backs off at most one second, so that a restarted picker is used again at once (gRPC's
// default grows to two minutes).
func DialPicker(addr string, useTLS bool) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // the picker's self-signed certificate
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay = 50 * time.Millisecond
	bo.MaxDelay = time.Second
	return grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 2 * time.Second}),
		// In BUFFERED mode a whole body is one message; the picker answers bodies in chunks,
		// but an immediate response may carry a large body.
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(math.MaxInt32), grpc.MaxCallRecvMsgSize(128<<20)),
	)
}

// parseDestinations splits x-gateway-destination-endpoint: an ordered list, the pick first
// and retry fallbacks after it. Invalid entries are skipped, as a data plane uses "the first
// valid entry" (docs/protocol.md).
func parseDestinations(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if validHostPort(s) {
			out = append(out, s)
		}
	}
	return out
}
