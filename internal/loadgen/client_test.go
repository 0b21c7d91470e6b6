package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/promtext"
	"github.com/kvpick/kvpick/pkg/gateway"
)

func TestExchangeAgainstThePicker(t *testing.T) {
	p := startInProcess(t, 8, 0)
	c, err := Dial(p.target.GRPCAddr, 2, p.target.Endpoints)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pool := NewChatPool(1, 4, 2, 2, 64<<10)
	ctx := context.Background()
	seen := map[string]bool{}
	for i, b := range pool.Bodies {
		added, dest, err := c.Exchange(ctx, -1, NewRequest(b, 16<<10, "t"))
		if err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		if added <= 0 || dest == "" {
			t.Fatalf("exchange %d: added %v, dest %q", i, added, dest)
		}
		seen[dest] = true
	}
	p.settled(t)
	// The picker committed every prompt: the index holds entries now.
	m, err := promtext.NewScraper(p.target.MetricsURL).Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Value("kvpick_prefix_index_entries") <= 0 {
		t.Error("no index entries after successful exchanges")
	}
	if got := m.Sum("kvpick_requests_total"); got != float64(len(pool.Bodies)) {
		t.Errorf("kvpick_requests_total %v, want %d", got, len(pool.Bodies))
	}

	// A held stream counts in flight until it finishes.
	h, err := c.Open(ctx, 0, NewRequest(pool.Bodies[0], 16<<10, "held"))
	if err != nil {
		t.Fatal(err)
	}
	if p.inFlight() != 1 {
		t.Errorf("in flight with one held stream: %d", p.inFlight())
	}
	if err := h.Finish(); err != nil {
		t.Fatal(err)
	}
	p.settled(t)

	// A response streamed token by token passes through whole.
	var sent atomic.Int64
	h, err = c.Open(ctx, 0, NewRequest(pool.Bodies[1], 16<<10, "streamed"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Stream(Tokens{N: 300, Sent: &sent}); err != nil {
		t.Fatal(err)
	}
	if sent.Load() != 301 {
		t.Errorf("%d chunks sent, want 300 tokens and the end", sent.Load())
	}
	p.settled(t)

	// A body the picker rejects is an error, by status.
	_, _, err = c.Exchange(ctx, 0, NewRequest([]byte(`{"messages":[]}`), 16<<10, "bad"))
	if err == nil || !strings.Contains(ErrorKey(err), "immediate response 400") {
		t.Fatalf("rejected body: got %v", err)
	}
	p.settled(t)
}

// fakeServer answers like a picker, with one thing wrong.
type fakeServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	fault string
}

func setHdr(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}

func (f *fakeServer) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		m, err := srv.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch r := m.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.GetBody()...)
			if !r.RequestBody.GetEndOfStream() {
				continue
			}
			switch f.fault {
			case "immediate":
				return srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
					ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: 503}}}})
			case "status":
				return status.Error(codes.Internal, "boom")
			}
			if f.fault == "short-body" {
				body = body[1:]
			}
			common := &extprocv3.CommonResponse{ClearRouteCache: f.fault != "no-clear",
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHdr("content-length", strconv.Itoa(len(body)))}}}
			if f.fault == "wrong-length" {
				common.HeaderMutation.SetHeaders[0] = setHdr("content-length", "1")
			}
			switch f.fault {
			case "no-destination":
			case "outside-pool":
				common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, setHdr(gateway.DestinationHeader, "192.0.2.1:80"))
			default:
				common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, setHdr(gateway.DestinationHeader, "10.0.0.1:8000,10.0.0.2:8000"))
			}
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
				RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
				return err
			}
			for off := 0; off < len(body); off += 62000 {
				end := min(off+62000, len(body))
				if err := srv.Send(streamedBody(true, body[off:end], end == len(body))); err != nil {
					return err
				}
			}
			if f.fault == "end-early" {
				return nil
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{}}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			b := r.ResponseBody.GetBody()
			if f.fault == "short-response" {
				b = b[:len(b)/2]
			}
			if err := srv.Send(streamedBody(false, b, r.ResponseBody.GetEndOfStream())); err != nil {
				return err
			}
			if f.fault == "error-at-close" {
				return status.Error(codes.Unavailable, "going away")
			}
		}
	}
}

func streamedBody(request bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

func TestExchangeCatchesMisbehaviour(t *testing.T) {
	for fault, want := range map[string]string{
		"":               "",
		"immediate":      "route: immediate response 503",
		"status":         "route: grpc Internal",
		"no-destination": "route: no destination header",
		"no-clear":       "route: clear_route_cache not set",
		"outside-pool":   "route: destination outside the pool",
		"short-body":     "body: re-emitted body length differs",
		"end-early":      "response-headers: stream ended early with OK",
		"short-response": "response-body: response not echoed whole",
		"wrong-length":   "route: protocol rule content-length",
		"error-at-close": "close: grpc Unavailable",
	} {
		t.Run(fault, func(t *testing.T) {
			gs := grpc.NewServer()
			extprocv3.RegisterExternalProcessorServer(gs, &fakeServer{fault: fault})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go gs.Serve(lis)
			defer gs.Stop()
			c, err := Dial(lis.Addr().String(), 1, []string{"10.0.0.1:8000", "10.0.0.2:8000"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, dest, err := c.Exchange(context.Background(), 0, NewRequest(make([]byte, 100000), 16<<10, "f"))
			if want == "" {
				if err != nil || dest != "10.0.0.1:8000" {
					t.Fatalf("clean exchange: dest %q, err %v", dest, err)
				}
				return
			}
			if err == nil || ErrorKey(err) != want {
				t.Fatalf("got %v (key %q), want key %q", err, ErrorKey(err), want)
			}
		})
	}
}

func TestStampNonce(t *testing.T) {
	pool := NewChatPool(2, 3, 2, 2, 20000)
	for i, body := range pool.Bodies {
		at := pool.NonceAt[i]
		if at < 0 || string(body[at:at+NonceLen]) != noncePlaceholder {
			t.Fatalf("body %d: no placeholder at %d", i, at)
		}
		req := NewRequest(body, 1000, "s")
		var into dataplane.Prepared
		for _, nonce := range []uint64{0xdeadbeef01234567, 0x0123456789abcdef} {
			got := StampNonce(req, &into, at, nonce).Body()
			want := append([]byte(nil), body...)
			copy(want[at:], fmt.Sprintf("%016x", nonce))
			if !bytes.Equal(got, want) {
				t.Fatalf("body %d: stamped body differs", i)
			}
			if !json.Valid(got) {
				t.Fatalf("body %d: stamped body is not JSON", i)
			}
		}
		if !bytes.Equal(req.Body(), body) {
			t.Fatal("StampNonce changed the original request")
		}
	}
}
