package peers

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Sink takes the peers' entries: the prefix index of this replica. peer is the publishing
// process (its log's instance) and id its number for the request, which ties a pick to the
// commit or drop that ends it. The pick and commit calls report false when the Sink has no
// endpoint at addr.
type Sink interface {
	ApplyPeerPick(peer, id uint64, addr string, hashes []uint64) bool
	ApplyPeerCommit(peer, id uint64, addr string, hashes []uint64) bool
	ApplyPeerDrop(peer, id uint64)
}

// Options configure a Poller.
type Options struct {
	// Peers are the other replicas' metrics addresses, "host:port". A host name is resolved
	// every ResolveInterval and each of its addresses followed (a Kubernetes headless
	// Service's name gives every ready replica); this replica's own address may be among
	// them (it is recognised by its log's instance and skipped).
	Peers []string
	// Interval between two polls of a peer (more at once while a peer has more to send);
	// Timeout bounds one poll, beyond its Wait.
	Interval, Timeout, ResolveInterval time.Duration
	// Wait, when positive, is how long a poll waits at the peer for an entry when it has none
	// (a long poll: an entry then arrives one round trip after it is published, not up to an
	// Interval later); after an answer with entries the next poll still waits Interval, so a
	// busy peer is asked at most once an Interval. At most MaxWait.
	Wait       time.Duration
	Log        *Log
	Sink       Sink
	Logger     *zap.Logger
	Registerer prometheus.Registerer
}

// Poller follows the peers' logs into the Sink.
type Poller struct {
	o      Options
	client *http.Client
	m      metrics
	lookup func(ctx context.Context, host string) ([]string, error)
}

type metrics struct {
	applied, picks, skipped, errors, gaps prometheus.Counter
	followed                              prometheus.Gauge
}

// NewPoller returns a Poller; Run starts it.
func NewPoller(o Options) (*Poller, error) {
	if o.Log == nil || o.Sink == nil {
		return nil, fmt.Errorf("peers: a log and a sink are needed")
	}
	if o.Interval <= 0 || o.Timeout <= 0 || o.ResolveInterval <= 0 {
		return nil, fmt.Errorf("peers: interval, timeout and resolveInterval must be positive")
	}
	if o.Wait < 0 || o.Wait > MaxWait {
		return nil, fmt.Errorf("peers: wait %v: must be between 0 and %v", o.Wait, MaxWait)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	for _, p := range o.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return nil, fmt.Errorf("peers: %q: %w", p, err)
		}
	}
	p := &Poller{o: o, client: &http.Client{Timeout: o.Timeout + o.Wait}, lookup: net.DefaultResolver.LookupHost}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	p.m = metrics{
		applied: counter("kvpick_peer_commits_applied_total",
			"Commits other picker replicas published that this replica's prefix index took."),
		picks: counter("kvpick_peer_picks_applied_total",
			"Picks other picker replicas published that became pending records here until their commit or drop."),
		skipped: counter("kvpick_peer_entries_skipped_total",
			"Peer picks and commits for an endpoint this replica does not have."),
		errors: counter("kvpick_peer_poll_errors_total",
			"Polls of a peer's commit log that failed (unreachable, timeout, garbage)."),
		gaps: counter("kvpick_peer_log_gaps_total",
			"Polls that found commits dropped from a peer's log before this replica read them."),
		followed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvpick_peer_addresses",
			Help: "Addresses the configured peers resolve to (this replica's own among them when listed; it is not polled once recognised)."}),
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{p.m.applied, p.m.picks, p.m.skipped, p.m.errors, p.m.gaps, p.m.followed} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// Run follows the peers until ctx ends.
func (p *Poller) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	following := map[string]context.CancelFunc{}
	defer func() {
		for _, stop := range following {
			stop()
		}
	}()
	t := time.NewTicker(p.o.ResolveInterval)
	defer t.Stop()
	for {
		want := p.resolve(ctx)
		for addr, stop := range following {
			if !slices.Contains(want, addr) {
				stop()
				delete(following, addr)
			}
		}
		for _, addr := range want {
			if _, ok := following[addr]; ok {
				continue
			}
			fctx, stop := context.WithCancel(ctx)
			following[addr] = stop
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.follow(fctx, addr)
			}()
		}
		p.m.followed.Set(float64(len(following)))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resolve returns every address the configured peers name now. A name that does not resolve
// keeps none (logged); an IP address is itself.
func (p *Poller) resolve(ctx context.Context) []string {
	var out []string
	for _, peer := range p.o.Peers {
		host, port, _ := net.SplitHostPort(peer)
		if net.ParseIP(host) != nil {
			out = append(out, peer)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
		ips, err := p.lookup(rctx, host)
		cancel()
		if err != nil {
			p.o.Logger.Warn("peer name does not resolve", zap.String("peer", peer), zap.Error(err))
			continue
		}
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip, port))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// peerState is what a follower knows of one peer's log.
type peerState struct {
	instance uint64 // 0 until the first answer
	since    uint64
}

// follow polls one address until ctx ends or the address turns out to be this replica. After
// failures it waits longer, doubling up to maxBackoff: a peer that is gone (a replica scaled
// away before the next resolve) costs a poll every few seconds, not fifty a second.
func (p *Poller) follow(ctx context.Context, addr string) {
	var st peerState
	failures := 0
	for {
		began, first := time.Now(), st.instance == 0
		more, got, self, err := p.poll(ctx, addr, &st)
		switch {
		case self:
			p.o.Logger.Debug("peer address is this replica: not followed", zap.String("peer", addr))
			return
		case err != nil && ctx.Err() == nil:
			p.m.errors.Inc()
			if failures++; failures == 1 {
				p.o.Logger.Warn("peer commit log unreachable", zap.String("peer", addr), zap.Error(err))
			}
		case err == nil:
			if failures > 0 {
				p.o.Logger.Info("peer commit log reachable again", zap.String("peer", addr))
			}
			failures = 0
		}
		if err == nil && (more || (p.o.Wait > 0 && !got && (first || time.Since(began) >= p.o.Wait/2))) {
			// More to read, or nothing new after the first poll (which does not wait: it
			// learns the peer's log) or after a long poll that waited in vain: ask again, and
			// wait, at once. (A peer that answers an empty long poll at once is an older build
			// that does not wait: it is asked every Interval.)
			continue
		}
		t := time.NewTimer(backoff(p.o.Interval, failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// maxBackoff bounds the wait between two polls of a failing peer.
const maxBackoff = 5 * time.Second

// backoff is the wait before the next poll after failures failed polls in a row: the interval,
// doubled per failure, at most maxBackoff (or the interval, if that is longer).
func backoff(interval time.Duration, failures int) time.Duration {
	wait := interval
	for i := 0; i < failures && wait < maxBackoff; i++ {
		wait *= 2
	}
	return min(wait, max(maxBackoff, interval))
}

// poll fetches and applies one answer. more: the peer has entries beyond it; got: the answer
// moved on.
func (p *Poller) poll(ctx context.Context, addr string, st *peerState) (more, got, self bool, err error) {
	url := "http://" + addr + Path + "?since=" + strconv.FormatUint(st.since, 10)
	if p.o.Wait > 0 && st.instance != 0 {
		// Not the first poll of a peer: that one learns its instance and log at once.
		url += "&wait=" + strconv.FormatInt(p.o.Wait.Milliseconds(), 10)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, false, false, err
	}
	req.Header.Set(InstanceHeader, strconv.FormatUint(p.o.Log.Instance(), 16))
	resp, err := p.client.Do(req)
	if err != nil {
		return false, false, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return false, false, false, fmt.Errorf("status %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 2*maxAnswerBytes))
	if err != nil {
		return false, false, false, err
	}
	a, err := decode(body)
	if err != nil {
		return false, false, false, err
	}
	if a.instance == p.o.Log.Instance() {
		return false, false, true, nil
	}
	if st.instance != a.instance {
		if st.instance != 0 {
			// The peer restarted: its sequence numbers start again.
			st.instance, st.since = a.instance, 0
			return true, true, false, nil
		}
		st.instance = a.instance
	}
	if a.first > st.since && st.since > 0 {
		p.m.gaps.Inc()
	}
	before := st.since
	for _, e := range a.entries {
		if e.seq < st.since {
			continue
		}
		switch e.kind {
		case KindPick:
			if p.o.Sink.ApplyPeerPick(a.instance, e.id, e.addr, e.hashes) {
				p.m.picks.Inc()
			} else {
				p.m.skipped.Inc()
			}
		case KindCommit:
			if p.o.Sink.ApplyPeerCommit(a.instance, e.id, e.addr, e.hashes) {
				p.m.applied.Inc()
			} else {
				p.m.skipped.Inc()
			}
		case KindDrop:
			p.o.Sink.ApplyPeerDrop(a.instance, e.id)
		}
		st.since = e.seq + 1
	}
	if st.since > a.next {
		st.since = a.next
	}
	// More only when this answer moved on: a peer that keeps sending the same entries is not
	// asked again at once.
	return st.since > before && st.since < a.next, st.since > before, false, nil
}
