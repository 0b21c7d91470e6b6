// Package gateway names what a gateway and an endpoint picker exchange under the Gateway API
// Inference Extension's endpoint-picker protocol (docs/protocol.md, "The endpoint-picker
// protocol"): the header and metadata that carry the chosen endpoint, the subset hint, the
// endpoint that served the request, and the request id. The picker (pkg/extproc) and the tools
// that play the gateway's part (internal/dataplane, internal/loadgen) use these names, so there
// is one spelling of each.
package gateway

const (
	// DestinationHeader carries the chosen endpoint, "ip:port" (or an ordered list
	// "ip:port,ip:port" whose later entries are retry fallbacks), from the picker to the proxy,
	// in a header mutation's raw_value.
	DestinationHeader = "x-gateway-destination-endpoint"
	// LBNamespace is the dynamic-metadata namespace in which the picker mirrors DestinationHeader
	// (key DestinationHeader) and the proxy reports the endpoint that served the request (key
	// ServedKey, in the response's metadata_context).
	LBNamespace = "envoy.lb"
	// ServedKey is the key, in LBNamespace, of the endpoint that actually served the request.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey hold the proxy's subset hint in the request's filter
	// metadata: the endpoints the picker may choose from, a list of "ip:port" or one
	// comma-separated string.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// RequestIDHeader is the request id the proxy and the picker log.
	RequestIDHeader = "x-request-id"
)
