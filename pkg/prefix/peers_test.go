package prefix

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// forward is a publisher that hands each entry to another replica's plugin at once, and
// records them.
type forward struct {
	to      *Plugin
	log     []string // "pick 1", "commit 1", "drop 2"
	applied []bool
	hashes  [][]uint64
}

func (f *forward) Pick(id uint64, addr string, hashes []uint64) {
	f.log = append(f.log, "pick "+itoa(id))
	f.to.ApplyPeerPick(7, id, addr, hashes)
}

func (f *forward) Commit(id uint64, addr string, hashes []uint64) {
	f.log = append(f.log, "commit "+itoa(id))
	f.hashes = append(f.hashes, slices.Clone(hashes))
	f.applied = append(f.applied, f.to.ApplyPeerCommit(7, id, addr, hashes))
}

func (f *forward) Drop(id uint64) {
	f.log = append(f.log, "drop "+itoa(id))
	f.to.ApplyPeerDrop(7, id)
}

func itoa(n uint64) string { return string(rune('0' + n)) }

// TestPeerEntriesReachTheOtherReplica: a replica publishes each pick and how it ended (a
// commit when its server took it, a drop when it failed), and another replica, whose pool
// lists the same servers as endpoints of its own, matches the prompt on the same server by
// address: as a pending record while the pick is open, in its index once committed, and not
// at all once dropped; entries for servers it does not have, or no longer has, are not taken.
func TestPeerEntriesReachTheOtherReplica(t *testing.T) {
	a, b := testPlugin(t), testPlugin(t)
	epsA, epsB := endpoints(3), endpoints(3)
	a.EndpointsChanged(epsA, nil)
	b.EndpointsChanged(epsB, nil)
	fw := &forward{to: b}
	a.PublishTo(fw)
	ctx := context.Background()
	bScores := func(question string) []float64 {
		next := chatRequest(t, longSystem, question)
		b.Prepare(ctx, next)
		return scores(b, next, epsB)
	}

	failed := chatRequest(t, longSystem, "failed question")
	a.Prepare(ctx, failed)
	a.Picked(failed, epsA[1])
	if s := bScores("failed question"); s[1] != 1 || b.peerPendingCount() != 1 {
		t.Fatalf("while the pick is open the other replica scores %v (%d peer picks), want it pending on 10.0.0.2", s, b.peerPendingCount())
	}
	a.ResponseHeaders(failed, epsA[1], 500)
	a.Done(failed, epsA[1])
	if s := bScores("failed question"); s[1] != 0 || b.peerPendingCount() != 0 {
		t.Fatalf("after the failure the other replica scores %v (%d peer picks)", s, b.peerPendingCount())
	}

	ok := chatRequest(t, longSystem, "the question")
	a.Prepare(ctx, ok)
	a.Picked(ok, epsA[2])
	a.ResponseHeaders(ok, epsA[2], 200)
	a.Done(ok, epsA[2])
	if s := bScores("the question"); s[2] != 1 || s[0] != 0 || s[1] != 0 || b.peerPendingCount() != 0 || !fw.applied[0] {
		t.Fatalf("after the commit the other replica scores %v (%d peer picks), want the prompt on 10.0.0.3 only", s, b.peerPendingCount())
	}
	// A stream that ends before any answer: the pick is dropped.
	gone := chatRequest(t, longSystem, "cancelled")
	a.Prepare(ctx, gone)
	a.Picked(gone, epsA[0])
	a.Done(gone, epsA[0])
	if want := []string{"pick 1", "drop 1", "pick 2", "commit 2", "pick 3", "drop 3"}; !slices.Equal(fw.log, want) {
		t.Fatalf("published %v, want %v", fw.log, want)
	}
	if b.ApplyPeerCommit(7, 9, "10.9.9.9:8000", fw.hashes[0]) || b.ApplyPeerPick(7, 9, "10.9.9.9:8000", fw.hashes[0]) {
		t.Fatal("an entry for a server b does not have was taken")
	}
	b.EndpointsChanged(nil, epsB[2:])
	if b.ApplyPeerCommit(7, 9, epsB[2].Addr, fw.hashes[0]) {
		t.Fatal("a commit for a removed server was taken")
	}
	a.PublishTo(nil)
	late := chatRequest(t, longSystem, "after stopping")
	a.Prepare(ctx, late)
	a.Picked(late, epsA[1])
	a.Done(late, epsA[1])
	if len(fw.log) != 6 {
		t.Fatal("a published after PublishTo(nil)")
	}
}

// peerObserver records what a PeerObserver is told.
type peerObserver struct {
	log   []string
	picks map[*PeerPick]bool // open
}

func (o *peerObserver) PeerPicked(p *PeerPick) {
	if o.picks == nil {
		o.picks = map[*PeerPick]bool{}
	}
	o.picks[p] = true
	o.log = append(o.log, fmt.Sprintf("pick %s seq %d uncached %d", p.Endpoint.Addr, p.Seq, p.Uncached))
}

func (o *peerObserver) PeerEnded(p *PeerPick, committed bool) {
	if !o.picks[p] {
		o.log = append(o.log, "end of an unknown or ended pick")
	}
	delete(o.picks, p)
	o.log = append(o.log, fmt.Sprintf("end %s seq %d committed %v", p.Endpoint.Addr, p.Seq, committed))
}

// TestPeerPicksAreToldToTheObservers: each peer pick applied is counted as a pick of its
// endpoint (after this replica's own) and told to the observers with the blocks the endpoint
// does not hold yet — none of a prompt it holds, the rest of one it holds the start of, the
// part beyond another peer pick's pending record — then ended exactly once: committed, dropped,
// or expired when its peer goes quiet.
func TestPeerPicksAreToldToTheObservers(t *testing.T) {
	pl, eps := testPlugin(t), endpoints(2)
	pl.EndpointsChanged(eps, nil)
	now := time.Unix(5000, 0)
	pl.now = func() time.Time { return now }
	o := &peerObserver{}
	pl.ObservePeers(o)
	ctx := context.Background()
	hashesOf := func(turns ...string) []uint64 {
		r := chatRequest(t, longSystem, turns...)
		pl.Prepare(ctx, r)
		return slices.Clone(pl.state(r).hashes)
	}
	short, long := hashesOf("q1"), hashesOf("q1", "a follow-up question long enough to add a block or two of its own to the prompt")
	if len(long) <= len(short) || commonPrefix(short, long) == 0 {
		t.Fatalf("test prompts: %d and %d blocks, %d shared", len(short), len(long), commonPrefix(short, long))
	}
	own := hashesOf("own")
	pl.Index().Insert(1, own) // endpoint 2 holds "own"

	pl.ApplyPeerPick(7, 1, eps[0].Addr, short)   // nothing held
	pl.ApplyPeerPick(7, 2, eps[0].Addr, long)    // short's blocks pending there
	pl.ApplyPeerPick(8, 1, eps[1].Addr, own)     // all held
	pl.ApplyPeerCommit(7, 1, eps[0].Addr, short) // short is in the cache
	pl.ApplyPeerDrop(8, 1)                       // dropped
	pl.ApplyPeerDrop(8, 99)                      // never picked: nothing to end
	shared := commonPrefix(short, long)
	want := []string{
		fmt.Sprintf("pick %s seq 1 uncached %d", eps[0].Addr, len(short)),
		fmt.Sprintf("pick %s seq 2 uncached %d", eps[0].Addr, len(long)-shared),
		fmt.Sprintf("pick %s seq 1 uncached 0", eps[1].Addr),
		fmt.Sprintf("end %s seq 1 committed true", eps[0].Addr),
		fmt.Sprintf("end %s seq 1 committed false", eps[1].Addr),
	}
	if !slices.Equal(o.log, want) {
		t.Fatalf("observer was told\n%s\nwant\n%s", strings.Join(o.log, "\n"), strings.Join(want, "\n"))
	}
	if eps[0].Picks() != 2 || eps[1].Picks() != 1 {
		t.Fatalf("picks counted %d and %d, want 2 and 1", eps[0].Picks(), eps[1].Picks())
	}
	// The peer goes quiet: its open pick expires with pendingTTL, at the next pick applied.
	o.log = nil
	now = now.Add(2 * time.Minute)
	pl.ApplyPeerPick(9, 1, eps[1].Addr, own)
	want = []string{
		fmt.Sprintf("pick %s seq 2 uncached 0", eps[1].Addr),
		fmt.Sprintf("end %s seq 2 committed false", eps[0].Addr),
	}
	if !slices.Equal(o.log, want) || len(o.picks) != 1 || pl.peerPendingCount() != 1 {
		t.Fatalf("after the TTL the observer was told\n%s\nwant\n%s (%d open)", strings.Join(o.log, "\n"), strings.Join(want, "\n"), len(o.picks))
	}
}
