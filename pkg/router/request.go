package router

import (
	"time"

	"github.com/kvpick/kvpick/pkg/openai"
)

// Request is what the pipeline knows about one HTTP request. The ext_proc server fills it in;
// plugins read it and may attach per-request state with Set/Get.
type Request struct {
	ID     string // x-request-id, generated when the client sent none
	Method string
	Path   string
	API    openai.API
	// Body is the parsed OpenAI body, nil for APIs routed by load alone or when the body could
	// not be read in full (BUFFERED_PARTIAL cut it, or the proxy does not send bodies).
	Body *openai.Request
	// Model is Body.Model when there is a body.
	Model string
	// Subset is the proxy's subset hint: when HasSubset, only these addresses are eligible.
	Subset    []string
	HasSubset bool
	// AffinityKey, when non-zero, breaks score ties by rendezvous hashing so that every picker
	// replica places the same new prompt on the same endpoint. The prefix plugin sets it to the
	// hash of the prompt's first block.
	AffinityKey uint64
	// Now is when the decision started (set by Pipeline.Schedule if zero): plugins compare it
	// with metrics' freshness instead of reading the clock each.
	Now time.Time
	// PickSeq is the request's pick number on the chosen endpoint (Endpoint.Picks after it was
	// counted), set by Schedule: the order in which the endpoint's server sees the requests.
	PickSeq int64
	// Explain, when set, receives the pipeline's reasoning (every candidate's scores) from
	// Schedule: for debug logs and the opt-in explanation header. nil on the hot path.
	Explain *Explanation

	state []stateEntry
}

// StateKey names one plugin's per-request state. Create one per plugin with NewStateKey.
type StateKey struct{ name string }

// NewStateKey returns a key that is distinct from every other key.
func NewStateKey(name string) *StateKey { return &StateKey{name: name} }

func (k *StateKey) String() string { return k.name }

type stateEntry struct {
	key *StateKey
	val any
}

// Set attaches plugin state to the request, replacing an earlier value for the same key.
func (r *Request) Set(k *StateKey, v any) {
	for i := range r.state {
		if r.state[i].key == k {
			r.state[i].val = v
			return
		}
	}
	r.state = append(r.state, stateEntry{k, v})
}

// Get returns the state attached under k, or nil.
func (r *Request) Get(k *StateKey) any {
	for i := range r.state {
		if r.state[i].key == k {
			return r.state[i].val
		}
	}
	return nil
}

// Reset clears the request for reuse, keeping its state slice's storage.
func (r *Request) Reset() {
	clear(r.state)
	*r = Request{state: r.state[:0]}
}
