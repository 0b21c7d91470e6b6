package replay

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvpick/kvpick/pkg/peers"
)

// PeerSync paces picker replicas that share their picks and commits (peers) to the virtual
// clock. Each replica's log is reached through a proxy here (the replicas' peers.addresses
// list the proxies), which sees how far each follower has read: a poll for the entries from
// since on comes after the follower applied every entry before since. After each exchange
// with a replica that may have published (its routing decision, the response headers and
// first body bytes it was sent) the driver calls Settle, which waits, in wall time, until
// every other replica has applied what that replica's log holds: simulated time does not move
// on while a pick or commit is in flight between replicas, so sharing runs repeat, and each
// entry reaches the others at once, as a long poll over a short round trip gives in
// production.
type PeerSync struct {
	real    []string // the replicas' metrics addresses
	proxies []*http.Server
	addrs   []string // the proxies' addresses, in replica order
	client  *http.Client
	wait    time.Duration

	mu      sync.Mutex
	changed chan struct{}       // closed and replaced at every poll seen
	read    []map[string]uint64 // per replica: follower instance → since of its latest poll
	settled []uint64            // per replica: its log's next entry, known applied everywhere
	stats   PeerSyncStats
}

// PeerSyncStats account for the waits.
type PeerSyncStats struct {
	Settles  int     `json:"settles"`
	Waited   int     `json:"waited"`
	WallSec  float64 `json:"wallSeconds"`
	Timeouts int     `json:"timeouts"`
	// Unpaced: a replica polled without naming itself (a build before stop 32): not paced.
	Unpaced bool `json:"unpaced,omitempty"`
}

// NewPeerSync starts a proxy on a free loopback port for each replica metrics address in real.
// wait bounds one Settle (0: 10 s).
func NewPeerSync(real []string, wait time.Duration) (*PeerSync, error) {
	if wait <= 0 {
		wait = 10 * time.Second
	}
	s := &PeerSync{real: real, client: &http.Client{Timeout: 30 * time.Second}, wait: wait,
		changed: make(chan struct{}), settled: make([]uint64, len(real))}
	for k := range real {
		s.read = append(s.read, map[string]uint64{})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			s.Close()
			return nil, err
		}
		srv := &http.Server{Handler: s.proxy(k), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
		s.proxies = append(s.proxies, srv)
		s.addrs = append(s.addrs, l.Addr().String())
	}
	return s, nil
}

// Addrs are the proxies' addresses: the replicas' peers.addresses.
func (s *PeerSync) Addrs() []string { return s.addrs }

// Stats returns the waits so far.
func (s *PeerSync) Stats() PeerSyncStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close stops the proxies.
func (s *PeerSync) Close() {
	for _, p := range s.proxies {
		_ = p.Close()
	}
}

// proxy forwards a follower's poll to replica k's log, noting how far the follower has read.
func (s *PeerSync) proxy(k int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		follower := r.Header.Get(peers.InstanceHeader)
		if follower == "" {
			// A picker built before pollers named themselves: its reads cannot be told
			// apart, so the run goes unpaced (counted) rather than waiting in vain.
			s.mu.Lock()
			s.stats.Unpaced = true
			s.mu.Unlock()
		} else if since, err := strconv.ParseUint(r.URL.Query().Get("since"), 10, 64); err == nil {
			s.mu.Lock()
			s.read[k][follower] = max(s.read[k][follower], since)
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+s.real[k]+r.URL.RequestURI(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := s.client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for key, v := range resp.Header {
			w.Header()[key] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
}

// logHead returns replica k's log instance and the number its next entry will get.
func (s *PeerSync) logHead(ctx context.Context, k int) (instance, next uint64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.real[k]+peers.Path+"?since="+strconv.FormatUint(1<<62, 10), nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("replica %d's log: status %d", k, resp.StatusCode)
	}
	if instance, next, err = peers.Head(b); err != nil {
		return 0, 0, fmt.Errorf("replica %d's log: %w", k, err)
	}
	return instance, next, nil
}

// Settle waits until every replica but k has applied every entry replica k's log holds now
// (at most the wait; a timeout is counted, not an error: the run goes on unpaced).
func (s *PeerSync) Settle(ctx context.Context, k int) error {
	instance, next, err := s.logHead(ctx, k)
	if err != nil {
		return err
	}
	self := strconv.FormatUint(instance, 16)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Settles++
	if next <= s.settled[k] || s.stats.Unpaced {
		return nil
	}
	t0 := time.Now()
	deadline := time.NewTimer(s.wait)
	defer deadline.Stop()
	for {
		caught := 0
		for follower, since := range s.read[k] {
			if follower != self && since >= next {
				caught++
			}
		}
		if caught >= len(s.real)-1 {
			break
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
			s.mu.Lock()
			continue
		case <-deadline.C:
			s.mu.Lock()
			s.stats.Timeouts++
		case <-ctx.Done():
			s.mu.Lock()
			return ctx.Err()
		}
		break
	}
	s.settled[k] = next
	s.stats.Waited++
	s.stats.WallSec += time.Since(t0).Seconds()
	return nil
}
