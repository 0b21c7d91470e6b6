package prefix

import (
	"context"
	"slices"
	"testing"
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
