package replay

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvpick/kvpick/pkg/peers"
)

// countingSink counts the peer entries a replica applied.
type countingSink struct {
	mu                    sync.Mutex
	picks, commits, drops int
}

func (s *countingSink) ApplyPeerPick(_, _ uint64, _ string, _ []uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.picks++
	return true
}

func (s *countingSink) ApplyPeerCommit(_, _ uint64, _ string, _ []uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commits++
	return true
}

func (s *countingSink) ApplyPeerDrop(_, _ uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drops++
}

func (s *countingSink) counts() [3]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return [3]int{s.picks, s.commits, s.drops}
}

// TestSettleReturnsOnceTheOtherReplicasApplied: two replicas follow each other's logs through
// the sync's proxies; after Settle for one, the other has applied everything its log held —
// at once, with no waiting in the test — and a Settle with nothing new does not wait.
func TestSettleReturnsOnceTheOtherReplicasApplied(t *testing.T) {
	logs := []*peers.Log{peers.NewLog(0), peers.NewLog(0)}
	var real []string
	for _, l := range logs {
		srv := httptest.NewServer(l.Handler())
		t.Cleanup(srv.Close)
		real = append(real, strings.TrimPrefix(srv.URL, "http://"))
	}
	ps, err := NewPeerSync(real, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ps.Close)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	sinks := []*countingSink{{}, {}}
	for k, l := range logs {
		p, err := peers.NewPoller(peers.Options{Peers: ps.Addrs(), Interval: 100 * time.Microsecond, Wait: 500 * time.Millisecond,
			Timeout: time.Second, ResolveInterval: time.Hour, Log: l, Sink: sinks[k]})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); p.Run(ctx) }()
	}

	for round := 1; round <= 20; round++ {
		logs[0].Pick(uint64(round), "10.0.0.1:8000", []uint64{1, 2})
		logs[0].Commit(uint64(round), "10.0.0.1:8000", []uint64{1, 2})
		if err := ps.Settle(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if got := sinks[1].counts(); got != [3]int{round, round, 0} {
			t.Fatalf("round %d: after Settle the other replica applied %v, want %d picks and commits", round, got, round)
		}
		logs[1].Drop(uint64(round))
		if err := ps.Settle(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if got := sinks[0].counts(); got != [3]int{0, 0, round} {
			t.Fatalf("round %d: after Settle replica 0 applied %v, want %d drops", round, got, round)
		}
	}
	before := ps.Stats()
	if err := ps.Settle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	after := ps.Stats()
	if before.Waited != 40 || after.Waited != before.Waited || after.Settles != before.Settles+1 || after.Timeouts != 0 {
		t.Fatalf("stats %+v then %+v: want 40 waits, none for a log with nothing new, no timeouts", before, after)
	}
}
