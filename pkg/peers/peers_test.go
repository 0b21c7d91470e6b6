package peers

import (
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func answerOf(t *testing.T, l *Log, since uint64) *answer {
	t.Helper()
	a, err := decode(l.appendAnswer(nil, since))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func seqs(a *answer) []uint64 {
	var out []uint64
	for _, e := range a.entries {
		out = append(out, e.seq)
	}
	return out
}

func TestLogAnswersFromSinceAndDropsTheOldestBeyondItsBound(t *testing.T) {
	l := NewLog(10)
	hs := []uint64{1, 2, 3, 4}
	l.Commit(1, "10.0.0.1:8000", hs)
	hs[0] = 99 // the log keeps its own copy
	l.Commit(2, "10.0.0.2:8000", []uint64{5, 6, 7})
	l.Commit(3, "10.0.0.1:8000", nil) // nothing to share: no entry
	a := answerOf(t, l, 0)
	if a.instance != l.Instance() || a.next != 2 || a.first != 0 || !slices.Equal(seqs(a), []uint64{0, 1}) {
		t.Fatalf("answer %+v", a)
	}
	if e := a.entries[0]; e.addr != "10.0.0.1:8000" || !slices.Equal(e.hashes, []uint64{1, 2, 3, 4}) {
		t.Fatalf("entry 0: %+v", e)
	}
	if got := seqs(answerOf(t, l, 1)); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("since 1: %v", got)
	}
	if got := answerOf(t, l, 2); len(got.entries) != 0 || got.next != 2 {
		t.Fatalf("since next: %+v", got)
	}
	// 4 + 3 + 5 = 12 hashes > 10: the oldest goes.
	l.Commit(4, "10.0.0.3:8000", []uint64{8, 9, 10, 11, 12})
	a = answerOf(t, l, 0)
	if a.first != 1 || !slices.Equal(seqs(a), []uint64{1, 2}) {
		t.Fatalf("after the bound: first %d, entries %v", a.first, seqs(a))
	}
	// The newest entry is kept even when it alone exceeds the bound.
	l.Commit(5, "10.0.0.4:8000", make([]uint64, 20))
	if a := answerOf(t, l, 0); !slices.Equal(seqs(a), []uint64{3}) {
		t.Fatalf("an oversized entry: %v", seqs(a))
	}
}

func TestLogCompactsAndAnswersInPieces(t *testing.T) {
	l := NewLog(1 << 30)
	big := make([]uint64, 40_000) // 320 KB an entry: an answer holds three
	for range 10 {
		l.Commit(6, "10.0.0.1:8000", big)
	}
	var got []uint64
	for since := uint64(0); since < 10; {
		a := answerOf(t, l, since)
		if len(a.entries) == 0 || len(a.entries) > 4 {
			t.Fatalf("since %d: %d entries", since, len(a.entries))
		}
		got = append(got, seqs(a)...)
		since = a.entries[len(a.entries)-1].seq + 1
	}
	if len(got) != 10 {
		t.Fatalf("read %v", got)
	}
	small := NewLog(100)
	for i := range 1000 {
		small.Commit(7, "a:1", []uint64{uint64(i)})
	}
	if len(small.entries) > 300 || answerOf(t, small, 0).first != 900 {
		t.Fatalf("log not compacted: %d slots, first %d", len(small.entries), answerOf(t, small, 0).first)
	}
}

func TestDecodeRejectsMalformedAnswers(t *testing.T) {
	l := NewLog(0)
	l.Commit(8, "10.0.0.1:8000", []uint64{1, 2})
	l.Commit(9, "10.0.0.1:8000", []uint64{3})
	good := l.appendAnswer(nil, 0)
	mut := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"another magic", mut(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"another version", mut(func(b []byte) []byte { b[4] = 2; return b })},
		{"truncated", good[:len(good)-3]},
		{"trailing bytes", append(slices.Clone(good), 0)},
		{"count beyond the bytes", mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[29:], 1<<31); return b })},
		{"blocks beyond the bytes", mut(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[headerBytes+18+len("10.0.0.1:8000"):], 1<<30)
			return b
		})},
		{"unknown kind", mut(func(b []byte) []byte { b[headerBytes+8] = 9; return b })},
		{"sequence going back", mut(func(b []byte) []byte {
			second := headerBytes + 18 + len("10.0.0.1:8000") + 4 + 16
			binary.LittleEndian.PutUint64(b[second:], 0)
			return b
		})},
	} {
		if _, err := decode(tc.b); err == nil {
			t.Errorf("%s: decoded", tc.name)
		}
	}
	if a, err := decode(good); err != nil || len(a.entries) != 2 {
		t.Fatalf("the good answer: %v", err)
	}
	// Picks and drops round-trip; a drop carries no address or blocks.
	k := NewLog(0)
	k.Pick(7, "10.0.0.1:8000", []uint64{1})
	k.Drop(7)
	a, err := decode(k.appendAnswer(nil, 0))
	if err != nil || len(a.entries) != 2 || a.entries[0].kind != KindPick || a.entries[0].id != 7 ||
		a.entries[1].kind != KindDrop || a.entries[1].id != 7 || a.entries[1].addr != "" || a.entries[1].hashes != nil {
		t.Fatalf("pick and drop: %+v, %v", a, err)
	}
	withBlocks := k.appendAnswer(nil, 0)
	dropAt := headerBytes + 18 + len("10.0.0.1:8000") + 4 + 8
	binary.LittleEndian.PutUint32(withBlocks[dropAt+18:], 1)
	if _, err := decode(append(withBlocks, make([]byte, 8)...)); err == nil {
		t.Fatal("a drop with blocks decoded")
	}
}

func FuzzDecode(f *testing.F) {
	l := NewLog(0)
	l.Commit(10, "10.0.0.1:8000", []uint64{1, 2})
	f.Add(l.appendAnswer(nil, 0))
	f.Add([]byte("KVPC"))
	k := NewLog(0)
	k.Pick(1, "10.0.0.1:8000", []uint64{1})
	k.Drop(1)
	f.Add(k.appendAnswer(nil, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decode(b)
		if err != nil {
			return
		}
		for _, e := range a.entries {
			// A pick or commit names an endpoint's blocks; a drop names nothing.
			drop := e.kind == KindDrop
			if drop != (len(e.hashes) == 0) || (drop && e.addr != "") || len(e.addr) > 255 ||
				(e.kind != KindPick && e.kind != KindCommit && !drop) {
				t.Fatalf("accepted entry %+v", e)
			}
		}
	})
}

// sink records what the poller applies; it knows the endpoints in known.
type sink struct {
	mu    sync.Mutex
	known map[string]bool
	got   map[string][][]uint64
	picks map[uint64]string // live picks by id
	ended []uint64          // ids committed or dropped, in order
}

func (s *sink) ApplyPeerPick(_, id uint64, addr string, _ []uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known[addr] {
		return false
	}
	if s.picks == nil {
		s.picks = map[uint64]string{}
	}
	s.picks[id] = addr
	return true
}

func (s *sink) ApplyPeerDrop(_, id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.picks, id)
	s.ended = append(s.ended, id)
}

func (s *sink) ApplyPeerCommit(_, id uint64, addr string, hashes []uint64) bool {
	s.ApplyPeerDrop(0, id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known[addr] {
		return false
	}
	s.got[addr] = append(s.got[addr], slices.Clone(hashes))
	return true
}

func (s *sink) count(addr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got[addr])
}

// runPoller runs p until the returned stop, which waits for it to end.
func runPoller(p *Poller) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPollerFollowsPeersIntoTheSink: a replica polls a peer's log and its own address; it
// applies the peer's commits for endpoints it has, counts the others as skipped, stops polling
// itself, starts over from the beginning when the peer restarts, and counts a dead peer's
// polls as errors.
func TestPollerFollowsPeersIntoTheSink(t *testing.T) {
	own, peer := NewLog(0), NewLog(0)
	var current atomic.Pointer[Log]
	current.Store(peer)
	var selfPolls atomic.Int64
	peerSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		current.Load().Handler().ServeHTTP(w, r)
	}))
	defer peerSrv.Close()
	ownSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		selfPolls.Add(1)
		own.Handler().ServeHTTP(w, r)
	}))
	defer ownSrv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()

	peer.Commit(11, "10.0.0.1:8000", []uint64{1, 2, 3})
	peer.Commit(12, "10.0.0.9:8000", []uint64{4}) // not in this replica's pool
	own.Commit(13, "10.0.0.1:8000", []uint64{7})  // its own: never applied back
	s := &sink{known: map[string]bool{"10.0.0.1:8000": true}, got: map[string][][]uint64{}}
	reg := prometheus.NewRegistry()
	host := func(u string) string { return strings.TrimPrefix(u, "http://") }
	p, err := NewPoller(Options{Peers: []string{host(peerSrv.URL), host(ownSrv.URL), host(dead.URL)},
		Interval: 5 * time.Millisecond, Timeout: time.Second, ResolveInterval: time.Hour, Log: own, Sink: s, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer runPoller(p)()

	eventually(t, "the peer's first commit applied", func() bool { return s.count("10.0.0.1:8000") == 1 })
	peer.Pick(14, "10.0.0.1:8000", []uint64{5})
	peer.Pick(16, "10.0.0.1:8000", []uint64{8})
	eventually(t, "the picks held", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.picks) == 2 })
	peer.Commit(14, "10.0.0.1:8000", []uint64{5})
	peer.Drop(16)
	eventually(t, "a later commit applied", func() bool { return s.count("10.0.0.1:8000") == 2 })
	eventually(t, "the picks ended", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.picks) == 0 })
	if testutil.ToFloat64(p.m.picks) != 2 {
		t.Fatalf("picks applied %v, want 2", testutil.ToFloat64(p.m.picks))
	}
	eventually(t, "the dead peer's polls counted", func() bool { return testutil.ToFloat64(p.m.errors) > 0 })
	if got := s.got["10.0.0.1:8000"]; !slices.Equal(got[0], []uint64{1, 2, 3}) || !slices.Equal(got[1], []uint64{5}) {
		t.Fatalf("applied %v", got)
	}
	if testutil.ToFloat64(p.m.skipped) != 1 || testutil.ToFloat64(p.m.applied) != 2 {
		t.Fatalf("applied %v, skipped %v", testutil.ToFloat64(p.m.applied), testutil.ToFloat64(p.m.skipped))
	}
	if n := selfPolls.Load(); n != 1 {
		t.Fatalf("this replica's own log was polled %d times, want once (recognised)", n)
	}

	// The peer restarts: a new log, sequence numbers from 0 again.
	restarted := NewLog(0)
	restarted.Commit(15, "10.0.0.1:8000", []uint64{6})
	current.Store(restarted)
	eventually(t, "the restarted peer's commit applied", func() bool { return s.count("10.0.0.1:8000") == 3 })
	if got := s.got["10.0.0.1:8000"][2]; !slices.Equal(got, []uint64{6}) {
		t.Fatalf("after the restart: %v", got)
	}
}

func TestPollerResolvesNamesToEveryAddress(t *testing.T) {
	p, err := NewPoller(Options{Peers: []string{"peers.example:9090", "10.0.0.5:9090"}, Interval: time.Second,
		Timeout: time.Second, ResolveInterval: time.Second, Log: NewLog(0), Sink: &sink{}})
	if err != nil {
		t.Fatal(err)
	}
	p.lookup = func(_ context.Context, host string) ([]string, error) {
		if host != "peers.example" {
			t.Fatalf("looked up %q", host)
		}
		return []string{"10.0.0.7", "10.0.0.5", "fd00::1"}, nil
	}
	got := p.resolve(context.Background())
	want := []string{"10.0.0.5:9090", "10.0.0.7:9090", "[fd00::1]:9090"}
	if !slices.Equal(got, want) {
		t.Fatalf("resolved %v, want %v", got, want)
	}
	if _, err := NewPoller(Options{Peers: []string{"no-port"}, Interval: time.Second, Timeout: time.Second,
		ResolveInterval: time.Second, Log: NewLog(0), Sink: &sink{}}); err == nil {
		t.Fatal("a peer without a port was accepted")
	}
}

func TestFailingPeersArePolledLessOften(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		interval time.Duration
		failures int
		want     time.Duration
	}{
		{20 * ms, 0, 20 * ms},
		{20 * ms, 1, 40 * ms},
		{20 * ms, 3, 160 * ms},
		{20 * ms, 8, 5 * time.Second},
		{20 * ms, 1000, 5 * time.Second},
		{10 * time.Second, 3, 10 * time.Second},
	} {
		if got := backoff(tc.interval, tc.failures); got != tc.want {
			t.Errorf("backoff(%v, %d) = %v, want %v", tc.interval, tc.failures, got, tc.want)
		}
	}
}

// TestALongPollAnswersWithTheNextEntry: a poll with wait that finds nothing new is held until
// the log's next entry, and answered with it; one that waits in vain is answered empty.
// A server shutting down (StopWaiting) answers its waiting polls at once.
func TestALongPollAnswersWithTheNextEntry(t *testing.T) {
	l := NewLog(0)
	l.Commit(1, "10.0.0.1:8000", []uint64{1})
	srv := httptest.NewServer(l.Handler())
	defer srv.Close()
	type result struct {
		a   *answer
		err error
	}
	get := func(query string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			resp, err := http.Get(srv.URL + Path + query)
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				ch <- result{err: err}
				return
			}
			a, err := decode(b)
			ch <- result{a, err}
		}()
		return ch
	}
	held := get("?since=1&wait=1000")
	eventually(t, "the poll waiting for an entry", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.wake != nil })
	l.Pick(2, "10.0.0.2:8000", []uint64{2})
	r := <-held
	if r.err != nil || len(r.a.entries) != 1 || r.a.entries[0].id != 2 || r.a.entries[0].kind != KindPick {
		t.Fatalf("held poll answered %+v, %v; want the pick published while it waited", r.a, r.err)
	}
	r = <-get("?since=2&wait=10")
	if r.err != nil || len(r.a.entries) != 0 || r.a.next != 2 {
		t.Fatalf("a poll that waited in vain answered %+v, %v; want no entries", r.a, r.err)
	}
	r = <-get("?since=0&wait=1000") // entries there already: answered at once
	if r.err != nil || len(r.a.entries) != 2 {
		t.Fatalf("a poll with entries to read answered %+v, %v", r.a, r.err)
	}
	// A server shutting down answers its waiting polls at once, and no later one waits.
	held = get("?since=2&wait=1000")
	eventually(t, "the second poll waiting", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.wake != nil })
	l.StopWaiting()
	if r := <-held; r.err != nil || len(r.a.entries) != 0 {
		t.Fatalf("a poll held at shutdown answered %+v, %v; want an empty answer", r.a, r.err)
	}
	r = <-get("?since=2&wait=1000")
	l.mu.Lock()
	waiting := l.wake != nil
	l.mu.Unlock()
	if r.err != nil || waiting {
		t.Fatalf("a poll after StopWaiting: %v, left a waiter: %v", r.err, waiting)
	}
	resp, err := http.Get(srv.URL + Path + "?since=0&wait=soon")
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a bad wait: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
}

// TestLongPollsBringEntriesBeforeTheNextInterval: with Wait, a follower whose Interval is an
// hour still takes a peer's entry as it is published: its polls wait at the peer, one after
// another while they wait in vain.
func TestLongPollsBringEntriesBeforeTheNextInterval(t *testing.T) {
	peer := NewLog(0)
	var polls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		polls.Add(1)
		peer.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	s := &sink{known: map[string]bool{"10.0.0.1:8000": true}, got: map[string][][]uint64{}}
	p, err := NewPoller(Options{Peers: []string{strings.TrimPrefix(srv.URL, "http://")}, Interval: time.Hour,
		Wait: 50 * time.Millisecond, Timeout: time.Second, ResolveInterval: time.Hour, Log: NewLog(0), Sink: s})
	if err != nil {
		t.Fatal(err)
	}
	defer runPoller(p)()
	// The first poll, then long polls that wait in vain, each followed by the next at once.
	eventually(t, "three polls", func() bool { return polls.Load() >= 3 })
	peer.Commit(1, "10.0.0.1:8000", []uint64{1})
	eventually(t, "the commit applied", func() bool { return s.count("10.0.0.1:8000") == 1 })
	if _, err := NewPoller(Options{Peers: []string{"a:1"}, Interval: time.Hour, Wait: 2 * MaxWait, Timeout: time.Second,
		ResolveInterval: time.Hour, Log: NewLog(0), Sink: s}); err == nil {
		t.Fatal("a wait beyond MaxWait was taken")
	}
}
