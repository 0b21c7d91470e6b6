package dataplane

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Rule names one rule of the ext_proc protocol that a server broke. Each rule carries the line of
// docs/protocol.md it comes from (see the package documentation and Rule.Source).
type Rule string

// The rules this client enforces. The package documentation lists them with their sources.
const (
	RuleOneAnswer             Rule = "one-answer-per-message"
	RuleAnswerKind            Rule = "answer-kind"
	RuleOrder                 Rule = "answer-order"
	RuleDuplexStreamed        Rule = "duplex-streamed-response"
	RuleDuplexEmptyBodyAnswer Rule = "duplex-empty-body-answer"
	RuleDuplexChunkSize       Rule = "duplex-chunk-size"
	RuleDuplexEndOfStream     Rule = "duplex-end-of-stream"
	RuleModeOverride          Rule = "duplex-mode-override"
	RuleContentLength         Rule = "content-length"
	RuleHeadersDeadlock       Rule = "headers-answer-deadlock"
	RuleStreamedOutsideDuplex Rule = "streamed-response-outside-duplex"
	RuleHeaderValueOnly       Rule = "header-value-only"
	RuleHeaderBothValues      Rule = "header-value-and-raw-value"
	RuleHeaderInvalid         Rule = "header-invalid"
	RuleTransferEncoding      Rule = "transfer-encoding"
	RuleDestination           Rule = "destination"
	RuleMessageTimeout        Rule = "message-timeout"
	RuleAfterImmediate        Rule = "after-immediate-response"
	RuleStreamEnd             Rule = "stream-end"
	RuleUnsupported           Rule = "unsupported"
)

var ruleSources = map[Rule]string{
	RuleOneAnswer:             "docs/protocol.md:50-51",
	RuleAnswerKind:            "docs/protocol.md:10-12,50-51",
	RuleOrder:                 "docs/protocol.md:28-29,44-47",
	RuleDuplexStreamed:        "docs/protocol.md:30-31",
	RuleDuplexEmptyBodyAnswer: "docs/protocol.md:36-37",
	RuleDuplexChunkSize:       "docs/protocol.md:32",
	RuleDuplexEndOfStream:     "docs/protocol.md:33,35-36",
	RuleModeOverride:          "docs/protocol.md:37-38",
	RuleContentLength:         "docs/protocol.md:33-34,43",
	RuleHeadersDeadlock:       "docs/protocol.md:39-41,44-46",
	RuleStreamedOutsideDuplex: "docs/protocol.md:30-31,39-43",
	RuleHeaderValueOnly:       "docs/protocol.md:19-21",
	RuleHeaderBothValues:      "docs/protocol.md:21-22",
	RuleHeaderInvalid:         "docs/protocol.md:19-22 (Envoy mutation_utils)",
	RuleTransferEncoding:      "docs/protocol.md:75",
	RuleDestination:           "docs/protocol.md:58-62",
	RuleMessageTimeout:        "docs/protocol.md:37,50-51 (Envoy message_timeout)",
	RuleAfterImmediate:        "docs/protocol.md:50-51",
	RuleStreamEnd:             "docs/protocol.md:23-24,54",
	RuleUnsupported:           "docs/protocol.md:38",
}

// Source returns where in docs/protocol.md the rule comes from.
func (r Rule) Source() string { return ruleSources[r] }

// ProtocolError reports a server that broke a rule of the protocol. Every deviation this client
// detects is one of these, so tests can assert on the Rule with errors.As or IsRule.
type ProtocolError struct {
	Rule Rule
	// Phase is the message the violation relates to: "request_headers", "request_body",
	// "request_trailers", "response_headers", "response_body", "response_trailers" or "stream".
	Phase  string
	Detail string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("ext_proc protocol violation [%s, %s] at %s: %s", e.Rule, e.Rule.Source(), e.Phase, e.Detail)
}

func protoErr(rule Rule, phase, format string, args ...any) *ProtocolError {
	return &ProtocolError{Rule: rule, Phase: phase, Detail: fmt.Sprintf(format, args...)}
}

// IsRule reports whether err is (or wraps) a *ProtocolError for rule.
func IsRule(err error, rule Rule) bool {
	var pe *ProtocolError
	return errors.As(err, &pe) && pe.Rule == rule
}

// StreamError reports that the server ended the stream with a non-OK gRPC status before the
// proxy was done. A proxy without failure_mode_allow fails the request with HTTPStatus (500, or
// 504 on a deadline) (docs/protocol.md:23-24).
type StreamError struct {
	Status     *status.Status
	HTTPStatus int
}

func (e *StreamError) Error() string {
	return fmt.Sprintf("ext_proc stream failed (%s: %s): the proxy answers %d",
		e.Status.Code(), e.Status.Message(), e.HTTPStatus)
}

func newStreamError(err error) *StreamError {
	st := status.Convert(err)
	code := 500
	if st.Code() == codes.DeadlineExceeded {
		code = 504
	}
	return &StreamError{Status: st, HTTPStatus: code}
}

// ImmediateError is returned by the response-side calls when the server answered with an
// ImmediateResponse there: processing ends and the proxy sends that reply instead.
type ImmediateError struct{ Immediate *Immediate }

func (e *ImmediateError) Error() string {
	return fmt.Sprintf("ext_proc server answered with an immediate response %d", e.Immediate.Status)
}

// ErrCanceled is the sticky error of an Exchange after Cancel.
var ErrCanceled = errors.New("dataplane: exchange canceled")

// errUsage marks a misuse of this package's API (not a server fault).
type usageError string

func (e usageError) Error() string { return "dataplane: " + string(e) }
