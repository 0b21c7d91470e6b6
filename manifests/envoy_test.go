package manifests

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

const envoyBootstrap = "envoy/envoy.yaml"

// decodeBootstrap reads an Envoy bootstrap as Envoy does: YAML to JSON to the Bootstrap proto
// (unknown fields refused, typed_config resolved by its @type), then Envoy's validation rules
// (protoc-gen-validate) on every message, those packed in Any included. It cannot catch what
// only Envoy checks at load time (cross-references, extension-specific rules); checkBootstrap
// covers the references an endpoint picker's wiring depends on.
func decodeBootstrap(b []byte) (*bootstrapv3.Bootstrap, error) {
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(j, bs); err != nil {
		return nil, fmt.Errorf("does not decode as envoy.config.bootstrap.v3.Bootstrap: %w", err)
	}
	if err := validateProto(bs); err != nil {
		return nil, err
	}
	return bs, nil
}

func validateProto(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var err error
	eachAny(m.ProtoReflect(), func(a *anypb.Any) {
		if err != nil {
			return
		}
		inner, e := a.UnmarshalNew()
		if e != nil {
			err = fmt.Errorf("%s: %w", a.GetTypeUrl(), e)
			return
		}
		err = validateProto(inner)
	})
	return err
}

// eachAny calls f for every Any under m (not looking inside the Anys).
func eachAny(m protoreflect.Message, f func(*anypb.Any)) {
	visit := func(msg protoreflect.Message) {
		if a, ok := msg.Interface().(*anypb.Any); ok {
			f(a)
			return
		}
		eachAny(msg, f)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			if fd.Message() != nil {
				for i := range v.List().Len() {
					visit(v.List().Get(i).Message())
				}
			}
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					visit(mv.Message())
					return true
				})
			}
		case fd.Message() != nil:
			visit(v.Message())
		}
		return true
	})
}

func unpack[T proto.Message](a *anypb.Any, m T) (T, bool) {
	if a == nil || !a.MessageIs(m) {
		return m, false
	}
	return m, a.UnmarshalTo(m) == nil
}

// checkBootstrap checks the wiring an endpoint picker needs (docs/protocol.md, "Reference
// Envoy wiring"): ext_proc in FULL_DUPLEX_STREAMED before the router, its cluster HTTP/2 over
// TLS, gRPC-health-checked and with raised circuit breakers, and every route's cluster an
// ORIGINAL_DST cluster reading x-gateway-destination-endpoint.
func checkBootstrap(w *world, healthService string, bs *bootstrapv3.Bootstrap) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	var hcms []*hcmv3.HttpConnectionManager
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if h, ok := unpack(f.GetTypedConfig(), &hcmv3.HttpConnectionManager{}); ok {
					hcms = append(hcms, h)
				}
			}
		}
	}
	if len(hcms) == 0 {
		fail("no listener with an http_connection_manager")
	}
	wantMode := &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
		RequestBodyMode:     extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode:    extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode:  extprocv3.ProcessingMode_SEND,
		ResponseTrailerMode: extprocv3.ProcessingMode_SEND,
	}
	pickerPort, _ := strconv.Atoi(w.binaries["kvpick"].flags["grpc-port"].Default)
	for _, h := range hcms {
		filters := h.GetHttpFilters()
		extIdx := -1
		for i, f := range filters {
			ep, ok := unpack(f.GetTypedConfig(), &extprocv3.ExternalProcessor{})
			if !ok {
				continue
			}
			extIdx = i
			if !proto.Equal(ep.GetProcessingMode(), wantMode) {
				fail("ext_proc processing_mode %v, want %v", ep.GetProcessingMode(), wantMode)
			}
			if len(ep.GetRequestAttributes())+len(ep.GetResponseAttributes()) > 0 {
				fail("ext_proc request_attributes/response_attributes should be empty: kvpick reads none")
			}
			if ep.GetFailureModeAllow() {
				fail("ext_proc failure_mode_allow true: with an ORIGINAL_DST cluster, requests the picker did not route go nowhere")
			}
			if d := ep.GetMessageTimeout().AsDuration(); d < 10*time.Second {
				fail("ext_proc message_timeout %v: the picker answers the headers only after the whole body; make it long", d)
			}
			cname := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()
			c := clusters[cname]
			if c == nil {
				fail("ext_proc grpc_service names cluster %q, which is not defined", cname)
				continue
			}
			errs = append(errs, checkPickerCluster(c, healthService, pickerPort)...)
		}
		if extIdx < 0 {
			fail("no envoy.filters.http.ext_proc filter")
		}
		if n := len(filters); n == 0 || filters[n-1].GetName() != "envoy.filters.http.router" || extIdx > n-1 {
			fail("the router must be the last HTTP filter, after ext_proc")
		}
		for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				ra := r.GetRoute()
				if ra == nil {
					continue
				}
				if d := ra.GetTimeout(); d == nil || (d.AsDuration() > 0 && d.AsDuration() < time.Minute) {
					fail("route %q: timeout %v: Envoy's 15 s default cuts generations short", r.GetMatch().GetPrefix(), d.AsDuration())
				}
				c := clusters[ra.GetCluster()]
				if c == nil {
					fail("route %q: cluster %q is not defined", r.GetMatch().GetPrefix(), ra.GetCluster())
					continue
				}
				cfg := c.GetOriginalDstLbConfig()
				switch {
				case c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED:
					fail("cluster %q: want type ORIGINAL_DST with lb_policy CLUSTER_PROVIDED", c.GetName())
				case !cfg.GetUseHttpHeader() || cfg.GetHttpHeaderName() != "x-gateway-destination-endpoint":
					fail("cluster %q: original_dst_lb_config must use the header x-gateway-destination-endpoint", c.GetName())
				}
				checkBreakers(c, fail)
			}
		}
	}
	return errs
}

func checkPickerCluster(c *clusterv3.Cluster, healthService string, port int) []error {
	var errs []error
	fail := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("ext_proc cluster %q: "+format, append([]any{c.GetName()}, a...)...))
	}
	opts, ok := unpack(c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], &upstreamhttpv3.HttpProtocolOptions{})
	if !ok || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		fail("must speak HTTP/2 (explicit_http_config.http2_protocol_options): gRPC")
	}
	tls, ok := unpack(c.GetTransportSocket().GetTypedConfig(), &tlsv3.UpstreamTlsContext{})
	if !ok {
		fail("no TLS transport_socket: kvpick serves TLS unless --secure-serving=false")
	} else if alpn := tls.GetCommonTlsContext().GetAlpnProtocols(); len(alpn) == 0 || alpn[0] != "h2" {
		fail("TLS alpn_protocols %v: gRPC servers require h2", alpn)
	}
	hc := false
	for _, h := range c.GetHealthChecks() {
		if s := h.GetGrpcHealthCheck(); s != nil {
			if s.GetServiceName() != healthService {
				fail("gRPC health check of service %q, want %q", s.GetServiceName(), healthService)
			}
			hc = true
		}
	}
	if !hc {
		fail("no gRPC health check")
	}
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			if p := e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); int(p) != port {
				fail("endpoint port %d, want kvpick's ext_proc port %d", p, port)
			}
		}
	}
	checkBreakers(c, func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) })
	return errs
}

func checkBreakers(c *clusterv3.Cluster, fail func(string, ...any)) {
	for _, t := range c.GetCircuitBreakers().GetThresholds() {
		if t.GetPriority() == 0 && t.GetMaxRequests().GetValue() > 1024 && t.GetMaxPendingRequests().GetValue() > 1024 {
			return
		}
	}
	fail("cluster %q: raise circuit_breakers (DEFAULT max_requests and max_pending_requests above Envoy's 1,024)", c.GetName())
}

func pickerHealthService(t *testing.T) string {
	t.Helper()
	consts, err := stringConsts("../pkg/runner/runner.go")
	if err != nil {
		t.Fatal(err)
	}
	s := consts["ServiceExtProc"]
	if s == "" {
		t.Fatal("pkg/runner/runner.go: constant ServiceExtProc not found")
	}
	return s
}

func TestEnvoyBootstrap(t *testing.T) {
	w := mustWorld(t)
	b, err := os.ReadFile(envoyBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := decodeBootstrap(b)
	if err != nil {
		t.Fatalf("%s: %v", envoyBootstrap, err)
	}
	for _, err := range checkBootstrap(w, pickerHealthService(t), bs) {
		t.Errorf("%s: %v", envoyBootstrap, err)
	}
}

func TestEnvoyChecksCatchBrokenBootstraps(t *testing.T) {
	w := mustWorld(t)
	orig, err := os.ReadFile(envoyBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"buffered body", "request_body_mode: FULL_DUPLEX_STREAMED", "request_body_mode: BUFFERED", "processing_mode"},
		{"misspelt field", "message_timeout: 300s", "message_timout: 300s", "message_timout"},
		{"short message timeout", "message_timeout: 300s", "message_timeout: 0.2s", "message_timeout"},
		{"fail open", "failure_mode_allow: false", "failure_mode_allow: true", "failure_mode_allow"},
		{"attributes requested", "request_attributes: []", "request_attributes: [request.path]", "request_attributes"},
		{"header routing off", "use_http_header: true", "use_http_header: false", "x-gateway-destination-endpoint"},
		{"wrong header", "http_header_name: x-gateway-destination-endpoint", "http_header_name: x-destination", "x-gateway-destination-endpoint"},
		{"ext_proc cluster missing", "envoy_grpc:\n                          cluster_name: kvpick", "envoy_grpc:\n                          cluster_name: kvpik", `cluster "kvpik", which is not defined`},
		{"route cluster missing", "cluster: model_servers", "cluster: models", `cluster "models" is not defined`},
		{"health service", "service_name: envoy.service.ext_proc.v3.ExternalProcessor", "service_name: readiness", `gRPC health check of service "readiness"`},
		{"HTTP/1 picker cluster", "http2_protocol_options:\n              connection_keepalive:\n                interval: 30s\n                timeout: 5s", "http_protocol_options: {}", "HTTP/2"},
		{"no ALPN", `alpn_protocols: ["h2"]`, `alpn_protocols: []`, "alpn_protocols"},
		{"port out of range", "port_value: 9002", "port_value: 90020", "PortValue"},
		{"wrong picker port", "port_value: 9002", "port_value: 9003", "endpoint port 9003"},
		{"unknown extension type", "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router", "type.googleapis.com/envoy.extensions.filters.http.router.v3.Routr", "Routr"},
		{"default circuit breakers", "max_requests: 100000\n\n    # kvpick", "max_requests: 1000\n\n    # kvpick", "circuit_breakers"},
		{"broken YAML", "  listeners:\n", "  listeners: [\n", "not valid YAML"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if n := strings.Count(string(orig), tc.old); n != 1 {
				t.Fatalf("%q occurs %d times in %s; the test needs exactly one", tc.old, n, envoyBootstrap)
			}
			text := strings.Replace(string(orig), tc.old, tc.new, 1)
			bs, err := decodeBootstrap([]byte(text))
			var errs []error
			if err != nil {
				errs = []error{err}
			} else {
				errs = checkBootstrap(w, pickerHealthService(t), bs)
			}
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Errorf("no error mentions %q; got %v", tc.want, errs)
		})
	}
}
