package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvpick/kvpick/pkg/gateway"
)

var chatBody = []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)

func postReq(body []byte) *HTTPRequest {
	return &HTTPRequest{
		Method: "POST", Path: "/v1/chat/completions", Authority: "gw.local",
		Headers: []Header{{"content-type", "application/json"}, {"content-length", strconv.Itoa(len(body))}},
		Body:    body,
	}
}

func modeWith(body filterv3.ProcessingMode_BodySendMode) Mode {
	return Mode{RequestBody: body, ResponseBody: body, RequestTrailers: true, ResponseTrailers: true, ResponseHeaders: true}
}

// kinds summarises what the server received on one stream.
func kinds(reqs []*extprocv3.ProcessingRequest) string {
	var out []string
	for _, r := range reqs {
		switch v := r.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			out = append(out, fmt.Sprintf("reqH(eos=%v)", v.RequestHeaders.GetEndOfStream()))
		case *extprocv3.ProcessingRequest_RequestBody:
			out = append(out, fmt.Sprintf("reqB(%d,eos=%v)", len(v.RequestBody.GetBody()), v.RequestBody.GetEndOfStream()))
		case *extprocv3.ProcessingRequest_RequestTrailers:
			out = append(out, "reqT")
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, fmt.Sprintf("respH(eos=%v)", v.ResponseHeaders.GetEndOfStream()))
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, fmt.Sprintf("respB(%d,eos=%v)", len(v.ResponseBody.GetBody()), v.ResponseBody.GetEndOfStream()))
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			out = append(out, "respT")
		}
	}
	return strings.Join(out, " ")
}

func TestCorrectRoutersInEveryMode(t *testing.T) {
	big := bytes.Repeat([]byte("a"), 40<<10) // 40 KiB: three 16 KiB chunks when streamed
	cases := []struct {
		name       string
		mode       Mode
		body       []byte
		opts       []Option
		wantKinds  string
		wantCL     string // "" = absent
		wantIgnore int
	}{
		{name: "full-duplex", mode: FullDuplex(), body: big,
			wantKinds: "reqH(eos=false) reqB(16384,eos=false) reqB(16384,eos=false) reqB(8192,eos=true)", wantCL: "40960"},
		{name: "buffered", mode: modeWith(filterv3.ProcessingMode_BUFFERED), body: big,
			wantKinds: "reqH(eos=false) reqB(40960,eos=true)", wantCL: "40960"},
		{name: "streamed-waiting", mode: modeWith(filterv3.ProcessingMode_STREAMED), body: big,
			wantKinds: "reqH(eos=false) reqB(16384,eos=false) reqB(16384,eos=false) reqB(8192,eos=true)", wantIgnore: 3},
		{name: "streamed-without-waiting", mode: func() Mode {
			m := modeWith(filterv3.ProcessingMode_STREAMED)
			m.SendBodyWithoutWaitingForHeaderResponse = true
			return m
		}(), body: big,
			wantKinds: "reqH(eos=false) reqB(16384,eos=false) reqB(16384,eos=false) reqB(8192,eos=true)", wantIgnore: 3},
		{name: "buffered-partial-cut", mode: modeWith(filterv3.ProcessingMode_BUFFERED_PARTIAL), body: big,
			opts: []Option{WithBufferLimit(1000)}, wantKinds: "reqH(eos=false) reqB(1000,eos=false)"},
		{name: "buffered-partial-fits", mode: modeWith(filterv3.ProcessingMode_BUFFERED_PARTIAL), body: chatBody,
			wantKinds: fmt.Sprintf("reqH(eos=false) reqB(%d,eos=true)", len(chatBody))},
		{name: "none", mode: modeWith(filterv3.ProcessingMode_NONE), body: chatBody,
			wantKinds: "reqH(eos=false)", wantCL: strconv.Itoa(len(chatBody))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter("")
			c := newEnv(t, r, tc.opts...)
			x, err := c.Open(context.Background(), tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			routed, err := x.Request(postReq(tc.body))
			if err != nil {
				t.Fatalf("Request: %v", err)
			}
			if err := x.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if routed.Destination != r.dest {
				t.Errorf("Destination = %q, want %q", routed.Destination, r.dest)
			}
			if got := routed.Metadata.GetFields()[gateway.LBNamespace].GetStructValue().GetFields()[gateway.DestinationHeader].GetStringValue(); got != r.dest {
				t.Errorf("metadata destination = %q", got)
			}
			if !routed.ClearRouteCache {
				t.Error("ClearRouteCache not recorded")
			}
			if !bytes.Equal(routed.Body, tc.body) {
				t.Errorf("Body: %d bytes, want %d", len(routed.Body), len(tc.body))
			}
			if cl, _ := Lookup(routed.Headers, "content-length"); cl != tc.wantCL {
				t.Errorf("content-length = %q, want %q", cl, tc.wantCL)
			}
			if len(routed.IgnoredHeaderMutations) != tc.wantIgnore {
				t.Errorf("IgnoredHeaderMutations = %d, want %d", len(routed.IgnoredHeaderMutations), tc.wantIgnore)
			}
			if _, ok := Lookup(routed.Headers, "x-ignored"); ok {
				t.Error("a header mutation from a STREAMED body answer was applied")
			}
			if got := kinds(r.rec.stream(0)); got != tc.wantKinds {
				t.Errorf("server saw %s\nwant         %s", got, tc.wantKinds)
			}
			for _, h := range []string{":method", ":path", ":authority", ":scheme"} {
				if _, ok := Lookup(routed.Headers, h); !ok {
					t.Errorf("pseudo header %s missing", h)
				}
			}
		})
	}
}

func TestGETHasNoBody(t *testing.T) {
	for _, mode := range []Mode{FullDuplex(), modeWith(filterv3.ProcessingMode_BUFFERED), modeWith(filterv3.ProcessingMode_STREAMED), modeWith(filterv3.ProcessingMode_NONE)} {
		r := newRouter("")
		c := newEnv(t, r)
		routed, _, err := c.Do(context.Background(), mode, &HTTPRequest{Method: "GET", Path: "/v1/models", Authority: "gw"}, nil)
		if err != nil {
			t.Fatalf("%v: %v", mode.RequestBody, err)
		}
		if routed.Destination != r.dest || routed.Body != nil {
			t.Errorf("%v: routed %+v", mode.RequestBody, routed)
		}
		if got := kinds(r.rec.stream(0)); got != "reqH(eos=true)" {
			t.Errorf("%v: server saw %s", mode.RequestBody, got)
		}
	}
}

// firstErr runs a POST (and a small response) and returns the first error of the exchange.
func firstErr(c *Client, mode Mode, req *HTTPRequest, resp *HTTPResponse) error {
	x, err := c.Open(context.Background(), mode)
	if err != nil {
		return err
	}
	routed, err := x.Request(req)
	if err != nil {
		x.Cancel()
		return err
	}
	if resp != nil && routed.Immediate == nil {
		if _, err := x.Response(resp); err != nil {
			x.Cancel()
			return err
		}
	}
	return x.Close()
}

func TestFaultyServers(t *testing.T) {
	duplexMode := FullDuplex()
	bufMode := modeWith(filterv3.ProcessingMode_BUFFERED)
	streamedNoWait := modeWith(filterv3.ProcessingMode_STREAMED)
	streamedNoWait.SendBodyWithoutWaitingForHeaderResponse = true
	big := bytes.Repeat([]byte("b"), 100_000)
	withTrailers := postReq(chatBody)
	withTrailers.Trailers = []Header{{"x-checksum", "1"}}
	get := &HTTPRequest{Method: "GET", Path: "/", Authority: "gw"}
	sse := &HTTPResponse{Status: 200, Chunks: [][]byte{[]byte("data: 1\n\n"), []byte("data: [DONE]\n\n")}}
	clientDest := postReq(chatBody)
	clientDest.Headers = append(clientDest.Headers, Header{gateway.DestinationHeader, "1.1.1.1:1"})
	cases := []struct {
		fault string
		mode  Mode
		req   *HTTPRequest
		resp  *HTTPResponse
		rule  Rule
	}{
		{fChunkTooBig, duplexMode, postReq(big), nil, RuleDuplexChunkSize},
		{fValueOnly, duplexMode, postReq(chatBody), nil, RuleHeaderValueOnly},
		{fBothValues, duplexMode, postReq(chatBody), nil, RuleHeaderBothValues},
		{fBodyBeforeHeaders, duplexMode, postReq(chatBody), nil, RuleOrder},
		{fEmptyBodyAnswer, duplexMode, postReq(chatBody), nil, RuleDuplexEmptyBodyAnswer},
		{fDuplexBodyMutation, duplexMode, postReq(chatBody), nil, RuleDuplexStreamed},
		{fWrongCL, duplexMode, postReq(chatBody), nil, RuleContentLength},
		{fNoCL, duplexMode, postReq(chatBody), nil, RuleContentLength},
		{fMissingEOS, duplexMode, postReq(chatBody), nil, RuleDuplexEndOfStream},
		{fEOSWithTrailers, duplexMode, withTrailers, nil, RuleDuplexEndOfStream},
		{fTrailersNoBody, duplexMode, withTrailers, nil, RuleOrder},
		{fModeOverride, duplexMode, postReq(chatBody), nil, RuleModeOverride},
		{fWaitBodyBuffered, bufMode, postReq(chatBody), nil, RuleHeadersDeadlock},
		{fTransferEncoding, duplexMode, postReq(chatBody), nil, RuleTransferEncoding},
		{fMetaMismatch, duplexMode, postReq(chatBody), nil, RuleDestination},
		{fAppendDestination, duplexMode, clientDest, nil, RuleDestination},
		{fBodyAnswerToHdrs, bufMode, postReq(chatBody), nil, RuleAnswerKind},
		{fTwoAnswers, bufMode, postReq(chatBody), nil, RuleOneAnswer},
		{fTwoAnswers, bufMode, get, nil, RuleOneAnswer},
		{fStreamedInBuffered, bufMode, postReq(chatBody), nil, RuleStreamedOutsideDuplex},
		{fStaleCL, bufMode, postReq(chatBody), nil, RuleContentLength},
		{fNoClose, duplexMode, postReq(chatBody), nil, RuleStreamEnd},
		{fWaitEOSStreamed, streamedNoWait, withTrailers, nil, RuleHeadersDeadlock},
		{fRespEmptyBody, duplexMode, postReq(chatBody), sse, RuleDuplexEmptyBodyAnswer},
		{fRespTwoAnswers, modeWith(filterv3.ProcessingMode_STREAMED), postReq(chatBody), sse, RuleOneAnswer},
	}
	for _, tc := range cases {
		t.Run(tc.fault+"/"+tc.mode.RequestBody.String(), func(t *testing.T) {
			r := newRouter(tc.fault)
			var opts []Option
			switch tc.rule {
			case RuleHeadersDeadlock, RuleStreamEnd, RuleMessageTimeout:
				// The server never answers: only a timeout can tell.
				opts = append(opts, WithMessageTimeout(300*time.Millisecond))
			}
			c := newEnv(t, r, opts...)
			err := firstErr(c, tc.mode, tc.req, tc.resp)
			if !IsRule(err, tc.rule) {
				t.Fatalf("got %v, want a ProtocolError for rule %s", err, tc.rule)
			}
			if strings.Contains(string(tc.rule), "deadlock") && !strings.Contains(err.Error(), "deadlock") {
				t.Errorf("deadlock report does not say so: %v", err)
			}
			t.Log(err)
		})
	}
}

func TestServerStatuses(t *testing.T) {
	t.Run("error status fails the request with 500", func(t *testing.T) {
		c := newEnv(t, newRouter(fErrorStatus))
		err := firstErr(c, FullDuplex(), postReq(chatBody), nil)
		var se *StreamError
		if !errors.As(err, &se) || se.HTTPStatus != 500 {
			t.Fatalf("got %v, want a StreamError with 500", err)
		}
	})
	t.Run("close with OK before answering continues unmodified", func(t *testing.T) {
		// Repeated: whether the body message is registered before the client learns that the stream
		// ended is a race, and once it forwarded that message twice.
		for i := range 3 * 10 {
			mode := []Mode{FullDuplex(), modeWith(filterv3.ProcessingMode_BUFFERED), modeWith(filterv3.ProcessingMode_STREAMED)}[i%3]
			c := newEnv(t, newRouter(fCloseOK))
			routed, fwd, err := c.Do(context.Background(), mode, postReq(chatBody),
				&HTTPResponse{Status: 200, Body: []byte("ok"), Trailers: []Header{{"t", "1"}}})
			if err != nil {
				t.Fatalf("%v: %v", mode.RequestBody, err)
			}
			if !routed.ServerGone || !bytes.Equal(routed.Body, chatBody) || routed.Destination != "" {
				t.Errorf("%v: routed %+v", mode.RequestBody, routed)
			}
			if string(fwd.Body) != "ok" || fwd.Trailers[0] != (Header{"t", "1"}) {
				t.Errorf("%v: forwarded %+v", mode.RequestBody, fwd)
			}
		}
	})
	t.Run("immediate response", func(t *testing.T) {
		c := newEnv(t, newRouter(fImmediate503))
		routed, _, err := c.Do(context.Background(), FullDuplex(), postReq(chatBody), &HTTPResponse{Status: 200})
		if err != nil {
			t.Fatal(err)
		}
		im := routed.Immediate
		if im == nil || im.Status != 503 || string(im.Body) != "no endpoint" || im.Headers[0] != (Header{"retry-after", "1"}) {
			t.Fatalf("immediate = %+v", im)
		}
	})
	t.Run("immediate response, then the server waits for the half-close", func(t *testing.T) {
		srv := &funcServer{fn: func(s extprocv3.ExternalProcessor_ProcessServer) error {
			if _, err := s.Recv(); err != nil {
				return err
			}
			err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
				ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}}}})
			if err != nil {
				return err
			}
			for { // drain whatever the proxy had in flight, until it half-closes
				if _, err := s.Recv(); err != nil {
					return nil
				}
			}
		}}
		c := newEnv(t, srv)
		routed, _, err := c.Do(context.Background(), FullDuplex(), postReq(bytes.Repeat([]byte("q"), 100_000)), &HTTPResponse{Status: 200})
		if err != nil {
			t.Fatal(err)
		}
		if routed.Immediate == nil || routed.Immediate.Status != 429 {
			t.Fatalf("routed = %+v", routed)
		}
	})
	t.Run("immediate response on the response side", func(t *testing.T) {
		c := newEnv(t, newRouter(fResponseImmediate))
		_, fwd, err := c.Do(context.Background(), FullDuplex(), postReq(chatBody), &HTTPResponse{Status: 200, Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if fwd.Immediate == nil || fwd.Immediate.Status != 500 {
			t.Fatalf("forwarded = %+v", fwd)
		}
	})
}

func TestProtocolConfigOnFirstMessageOnly(t *testing.T) {
	for _, omit := range []bool{false, true} {
		r := newRouter("")
		c := newEnv(t, r)
		mode := FullDuplex()
		mode.OmitProtocolConfig = omit
		req := postReq(chatBody)
		req.Trailers = []Header{{"x-t", "1"}}
		if _, _, err := c.Do(context.Background(), mode, req, &HTTPResponse{Status: 200, Body: []byte("hi")}); err != nil && !omit {
			t.Fatal(err)
		}
		msgs := r.rec.stream(0)
		for i, m := range msgs {
			pc := m.GetProtocolConfig()
			switch {
			case i == 0 && !omit:
				if pc.GetRequestBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
					pc.GetResponseBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
					t.Errorf("first message protocol_config = %v", pc)
				}
			case pc != nil:
				t.Errorf("omit=%v: message %d carries protocol_config", omit, i)
			}
		}
	}
}

func TestHeaderEncoding(t *testing.T) {
	for _, useValue := range []bool{false, true} {
		r := newRouter("")
		c := newEnv(t, r)
		req := postReq(chatBody)
		req.HeaderValueField = useValue
		if _, _, err := c.Do(context.Background(), FullDuplex(), req, nil); err != nil {
			t.Fatal(err)
		}
		hs := r.rec.stream(0)[0].GetRequestHeaders().GetHeaders().GetHeaders()
		got := map[string]*corev3.HeaderValue{}
		for _, h := range hs {
			got[h.GetKey()] = h
		}
		for _, k := range []string{":method", ":path", ":authority", ":scheme", "content-type"} {
			h := got[k]
			if h == nil {
				t.Fatalf("header %s not sent", k)
			}
			if useValue != (h.GetValue() != "") || useValue == (len(h.GetRawValue()) > 0) {
				t.Errorf("useValue=%v: header %s = %v", useValue, k, h)
			}
		}
	}
}

func TestSubsetHintShapes(t *testing.T) {
	for _, asString := range []bool{false, true} {
		r := newRouter("")
		c := newEnv(t, r)
		req := postReq(chatBody)
		req.SubsetHint = []string{"10.0.0.1:8000", "10.0.0.2:8000"}
		req.SubsetHintAsString = asString
		if _, _, err := c.Do(context.Background(), FullDuplex(), req, &HTTPResponse{Status: 200, ServedEndpoint: "10.0.0.1:8000"}); err != nil {
			t.Fatal(err)
		}
		msgs := r.rec.stream(0)
		v := msgs[0].GetMetadataContext().GetFilterMetadata()[gateway.SubsetNamespace].GetFields()[gateway.SubsetKey]
		if asString {
			if v.GetStringValue() != "10.0.0.1:8000,10.0.0.2:8000" {
				t.Errorf("string hint = %v", v)
			}
		} else {
			l := v.GetListValue().GetValues()
			if len(l) != 2 || l[0].GetStringValue() != "10.0.0.1:8000" || l[1].GetStringValue() != "10.0.0.2:8000" {
				t.Errorf("list hint = %v", v)
			}
		}
		// The served endpoint rides on the response messages.
		var served string
		for _, m := range msgs {
			if m.GetResponseHeaders() != nil {
				served = m.GetMetadataContext().GetFilterMetadata()[gateway.LBNamespace].GetFields()[gateway.ServedKey].GetStringValue()
			}
		}
		if served != "10.0.0.1:8000" {
			t.Errorf("served endpoint metadata = %q", served)
		}
	}
}

func TestTrailersInEachMode(t *testing.T) {
	streamedNoWait := modeWith(filterv3.ProcessingMode_STREAMED)
	streamedNoWait.SendBodyWithoutWaitingForHeaderResponse = true
	skip := modeWith(filterv3.ProcessingMode_BUFFERED)
	skip.RequestTrailers, skip.ResponseTrailers = false, false
	cases := []struct {
		name      string
		mode      Mode
		wantKinds string
		mutated   bool
	}{
		{"full-duplex", FullDuplex(), "reqH(eos=false) reqB(5,eos=false) reqB(5,eos=false) reqT respH(eos=false) respB(3,eos=false) respB(3,eos=false) respT", true},
		{"buffered", modeWith(filterv3.ProcessingMode_BUFFERED), "reqH(eos=false) reqB(10,eos=false) reqT respH(eos=false) respB(6,eos=false) respT", true},
		{"streamed", modeWith(filterv3.ProcessingMode_STREAMED), "reqH(eos=false) reqB(5,eos=false) reqB(5,eos=false) reqT respH(eos=false) respB(3,eos=false) respB(3,eos=false) respT", true},
		{"streamed-no-wait", streamedNoWait, "reqH(eos=false) reqB(5,eos=false) reqB(5,eos=false) reqT respH(eos=false) respB(3,eos=false) respB(3,eos=false) respT", true},
		{"buffered-skip-trailers", skip, "reqH(eos=false) reqB(10,eos=false) respH(eos=false) respB(6,eos=false)", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter("")
			c := newEnv(t, r)
			req := postReq(nil)
			req.Headers = nil
			req.Chunks = [][]byte{[]byte(`{"a":`), []byte(`"bc"}`)}
			req.Trailers = []Header{{"x-checksum", "abc"}}
			routed, fwd, err := c.Do(context.Background(), tc.mode, req, &HTTPResponse{
				Status: 200, Chunks: [][]byte{[]byte("foo"), []byte("bar")}, Trailers: []Header{{"grpc-status", "0"}}})
			if err != nil {
				t.Fatal(err)
			}
			if got := kinds(r.rec.stream(0)); got != tc.wantKinds {
				t.Errorf("server saw %s\nwant         %s", got, tc.wantKinds)
			}
			if string(routed.Body) != `{"a":"bc"}` || string(fwd.Body) != "foobar" {
				t.Errorf("bodies %q / %q", routed.Body, fwd.Body)
			}
			_, reqSeen := Lookup(routed.Trailers, "x-trailer-seen")
			_, respSeen := Lookup(fwd.Trailers, "x-trailer-seen")
			if reqSeen != tc.mutated || respSeen != tc.mutated {
				t.Errorf("trailer mutation applied: request %v response %v, want %v", reqSeen, respSeen, tc.mutated)
			}
			if v, _ := Lookup(routed.Trailers, "x-checksum"); v != "abc" {
				t.Errorf("request trailers %v", routed.Trailers)
			}
			if v, _ := Lookup(fwd.Headers, "x-picker"); v != "on" {
				t.Errorf("response headers %v", fwd.Headers)
			}
		})
	}
}

// In FULL_DUPLEX each SSE chunk must come out before the next one goes in.
func TestSSEChunksForwardedOneByOne(t *testing.T) {
	r := newRouter("")
	c := newEnv(t, r)
	x, err := c.Open(context.Background(), FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	defer x.Cancel()
	if _, err := x.Request(postReq(chatBody)); err != nil {
		t.Fatal(err)
	}
	hs, im, err := x.ResponseHeaders(200, []Header{{"content-type", "text/event-stream"}}, "10.0.0.1:8000", false)
	if err != nil || im != nil {
		t.Fatal(err, im)
	}
	if hs[0] != (Header{":status", "200"}) {
		t.Errorf("headers %v", hs)
	}
	events := []string{"data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: {\"a\":3}\n\n", "data: [DONE]\n\n"}
	for i, ev := range events {
		last := i == len(events)-1
		if err := x.ResponseBody([]byte(ev), last); err != nil {
			t.Fatal(err)
		}
		// A bound against a hang, not a speed requirement.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got, eos, err := x.NextResponseBody(ctx)
		cancel()
		if err != nil || string(got) != ev || eos {
			t.Fatalf("event %d: got %q eos=%v err=%v", i, got, eos, err)
		}
	}
	got, eos, err := x.NextResponseBody(context.Background())
	if err != nil || got != nil || !eos {
		t.Fatalf("end: %q %v %v", got, eos, err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
}

// A gateway drains NextResponseBody in its own goroutine while feeding upstream chunks.
func TestConcurrentFeedAndDrain(t *testing.T) {
	c := newEnv(t, newRouter(""))
	for _, mode := range []Mode{FullDuplex(), modeWith(filterv3.ProcessingMode_STREAMED), modeWith(filterv3.ProcessingMode_BUFFERED), modeWith(filterv3.ProcessingMode_NONE)} {
		x, err := c.Open(context.Background(), mode)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.Request(postReq(chatBody)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := x.ResponseHeaders(200, nil, "", false); err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		drained := make(chan error, 1)
		go func() {
			for {
				b, eos, err := x.NextResponseBody(context.Background())
				if err != nil {
					drained <- err
					return
				}
				got.Write(b)
				if eos {
					drained <- nil
					return
				}
			}
		}()
		var want bytes.Buffer
		for i := 0; i < 200; i++ {
			ev := []byte(fmt.Sprintf("data: %d\n\n", i))
			want.Write(ev)
			if err := x.ResponseBody(ev, i == 199); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("%v: forwarded %d bytes, want %d", mode.ResponseBody, got.Len(), want.Len())
		}
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOneMegabyteBody(t *testing.T) {
	body := make([]byte, 1<<20)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	for _, mode := range []Mode{FullDuplex(), modeWith(filterv3.ProcessingMode_BUFFERED), modeWith(filterv3.ProcessingMode_STREAMED)} {
		r := newRouter("")
		c := newEnv(t, r)
		routed, fwd, err := c.Do(context.Background(), mode, postReq(body), &HTTPResponse{Status: 200, Body: body})
		if err != nil {
			t.Fatalf("%v: %v", mode.RequestBody, err)
		}
		if !bytes.Equal(routed.Body, body) || !bytes.Equal(fwd.Body, body) {
			t.Fatalf("%v: body mismatch", mode.RequestBody)
		}
		if mode.RequestBody == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			if cl, _ := Lookup(routed.Headers, "content-length"); cl != strconv.Itoa(len(body)) {
				t.Errorf("content-length %q", cl)
			}
			n := 0
			for _, m := range r.rec.stream(0) {
				if m.GetRequestBody() != nil {
					n++
				}
			}
			if n != 64 {
				t.Errorf("proxy sent %d request chunks, want 64 of 16 KiB", n)
			}
		}
	}
}

func TestMutationSemantics(t *testing.T) {
	srv := &funcServer{fn: func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		set := []*corev3.HeaderValueOption{
			hv(":authority", "evil"), hv("host", "evil"), hv(":method", "PUT"), hv("x-envoy-foo", "1"),
			hv(":path", "/rewritten"),
			{Header: &corev3.HeaderValue{Key: "x-multi", RawValue: []byte("2")}, Append: wrapperspb.Bool(true)},
			{Header: &corev3.HeaderValue{Key: "x-replace", RawValue: []byte("new")}, Append: wrapperspb.Bool(false)},
			{Header: &corev3.HeaderValue{Key: "x-keep", RawValue: []byte("no")}, AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT},
			{Header: &corev3.HeaderValue{Key: "x-absent", RawValue: []byte("no")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS},
			hv("X-Upper", "v"),
		}
		err := s.Send(reqHeadersAnswer(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: set, RemoveHeaders: []string{"x-remove", ":path", "host"}}, ClearRouteCache: true}))
		if err != nil {
			return err
		}
		_, err = s.Recv() // EOF after the proxy half-closes
		if err != nil {
			return nil
		}
		return nil
	}}
	c := newEnv(t, srv)
	req := &HTTPRequest{Method: "GET", Path: "/p", Authority: "gw", Headers: []Header{
		{"x-remove", "1"}, {"x-multi", "1"}, {"x-replace", "old"}, {"x-replace", "old2"}, {"x-keep", "yes"}}}
	routed, _, err := c.Do(context.Background(), modeWith(filterv3.ProcessingMode_NONE), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Header{{":method", "GET"}, {":path", "/rewritten"}, {":authority", "gw"}, {":scheme", "http"},
		{"x-multi", "1"}, {"x-replace", "new"}, {"x-keep", "yes"}, {"x-multi", "2"}, {"x-upper", "v"}}
	if fmt.Sprint(routed.Headers) != fmt.Sprint(want) {
		t.Errorf("headers\n got %v\nwant %v", routed.Headers, want)
	}
	if len(routed.Notes) != 6 || !routed.ClearRouteCache {
		t.Errorf("notes %q clear=%v", routed.Notes, routed.ClearRouteCache)
	}
}

// Cancel at any point (mid request body, mid response body, or via the context) leaves no
// goroutine behind, on either side of the loopback connection.
func TestCancelLeavesNoGoroutines(t *testing.T) {
	r := newRouter("")
	r.gate = make(chan struct{})
	stop := make(chan struct{})
	defer close(stop)
	go func() { // let the server read slowly, so the proxy is mid-body when it cancels
		for {
			select {
			case r.gate <- struct{}{}:
				time.Sleep(100 * time.Microsecond)
			case <-stop:
				return
			}
		}
	}()
	c := newEnv(t, r)
	if _, _, err := c.Do(context.Background(), FullDuplex(), postReq(chatBody), nil); err != nil {
		t.Fatal(err) // warm up the connection
	}
	time.Sleep(50 * time.Millisecond)
	base := runtime.NumGoroutine()
	big := bytes.Repeat([]byte("z"), 4<<20)

	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(3)
		go func() { // cancel mid request body
			defer wg.Done()
			x, err := c.Open(context.Background(), FullDuplex())
			if err != nil {
				t.Error(err)
				return
			}
			time.AfterFunc(2*time.Millisecond, x.Cancel)
			if _, err := x.Request(postReq(big)); !errors.Is(err, ErrCanceled) {
				t.Errorf("Request after Cancel: %v", err)
			}
			x.Cancel()
		}()
		go func() { // cancel mid response body while a drain goroutine waits
			defer wg.Done()
			x, err := c.Open(context.Background(), FullDuplex())
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := x.Request(postReq(chatBody)); err != nil {
				t.Error(err)
				x.Cancel()
				return
			}
			if _, _, err := x.ResponseHeaders(200, nil, "", false); err != nil {
				t.Error(err)
				x.Cancel()
				return
			}
			done := make(chan error, 1)
			go func() {
				for {
					if _, _, err := x.NextResponseBody(context.Background()); err != nil {
						done <- err
						return
					}
				}
			}()
			_ = x.ResponseBody([]byte("data: 1\n\n"), false)
			time.Sleep(time.Millisecond)
			x.Cancel()
			if err := <-done; !errors.Is(err, ErrCanceled) {
				t.Errorf("NextResponseBody after Cancel: %v", err)
			}
		}()
		go func() { // the caller's context ends mid body
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			x, err := c.Open(ctx, FullDuplex())
			if err != nil {
				t.Error(err)
				cancel()
				return
			}
			time.AfterFunc(2*time.Millisecond, cancel)
			if _, err := x.Request(postReq(big)); err == nil {
				t.Error("Request survived its context")
			}
			_ = x.Close()
		}()
	}
	wg.Wait()
	// The goroutines end soon after the calls return; the deadline only bounds a leak's wait.
	deadline := time.Now().Add(time.Minute)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines left over (base %d):\n%s", n-base, base, buf[:runtime.Stack(buf, true)])
	}
}

func TestManyConcurrentExchanges(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	r := newRouter("")
	c := newEnv(t, r)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			body := []byte(fmt.Sprintf(`{"model":"m","prompt":"%d"}`, i))
			routed, fwd, err := c.Do(context.Background(), FullDuplex(), postReq(body),
				&HTTPResponse{Status: 200, Chunks: [][]byte{[]byte("data: a\n\n"), []byte("data: [DONE]\n\n")}})
			switch {
			case err != nil:
				errs <- err
			case !bytes.Equal(routed.Body, body) || routed.Destination != r.dest || len(fwd.Chunks) != 2:
				errs <- fmt.Errorf("exchange %d: routed %+v forwarded %+v", i, routed, fwd)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestExtraAnswerDetectedAtClose(t *testing.T) {
	srv := &funcServer{fn: func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if err := s.Send(reqHeadersAnswer(&extprocv3.CommonResponse{})); err != nil {
			return err
		}
		if _, err := s.Recv(); err != nil { // the proxy half-closes
			_ = s.Send(reqHeadersAnswer(&extprocv3.CommonResponse{}))
		}
		return nil
	}}
	c := newEnv(t, srv)
	_, _, err := c.Do(context.Background(), FullDuplex(), &HTTPRequest{Method: "GET", Path: "/", Authority: "gw"}, nil)
	if !IsRule(err, RuleOneAnswer) {
		t.Fatalf("got %v", err)
	}
}

func TestModeValidation(t *testing.T) {
	c := New(nil)
	m := FullDuplex()
	m.RequestTrailers = false
	if _, err := c.Open(context.Background(), m); err == nil {
		t.Fatal("FULL_DUPLEX_STREAMED with trailer mode SKIP was accepted")
	}
}

// BenchmarkDoFullDuplex: one whole request (4 KiB body, two SSE chunks) through the loopback
// fake router: the client's cost per exchange as the replay benchmark sees it.
func BenchmarkDoFullDuplex(b *testing.B) {
	c := newEnv(b, newRouter(""))
	body := bytes.Repeat([]byte("x"), 4<<10)
	resp := &HTTPResponse{Status: 200, Chunks: [][]byte{[]byte("data: a\n\n"), []byte("data: [DONE]\n\n")}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := c.Do(context.Background(), FullDuplex(), postReq(body), resp); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
