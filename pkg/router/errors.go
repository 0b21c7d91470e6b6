package router

import "fmt"

// Error is a routing failure that the ext_proc server turns into an OpenAI-style error response.
type Error struct {
	Status  int    // HTTP status for the client
	Type    string // OpenAI error type
	Code    string // machine-readable code
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// ErrNoEndpoint reports that no endpoint is eligible: the pool is empty, or filters (the subset
// hint, health) excluded them all.
func ErrNoEndpoint(msg string) *Error {
	return &Error{Status: 503, Type: "service_unavailable", Code: "no_endpoint", Message: msg}
}

// ErrOverloaded reports that every eligible endpoint is over its load limit: the request is shed.
func ErrOverloaded(msg string) *Error {
	return &Error{Status: 429, Type: "rate_limit_exceeded", Code: "overloaded", Message: msg}
}
