package prefix

import (
	"context"
	"slices"
	"testing"

	"github.com/kvpick/kvpick/pkg/router"
)

// forward is a publisher that hands each commit to another replica's plugin at once.
type forward struct {
	to      *Plugin
	applied []bool
	hashes  [][]uint64
}

func (f *forward) Publish(addr string, hashes []uint64) {
	f.hashes = append(f.hashes, slices.Clone(hashes))
	f.applied = append(f.applied, f.to.ApplyPeerCommit(addr, hashes))
}

// TestPeerCommitsReachTheOtherReplicasIndex: a replica publishes what its servers took (not
// what failed), and another replica, whose pool lists the same servers as endpoints of its
// own, then matches the prompt on the same server, by address; a commit for a server it does
// not have, or no longer has, is not taken.
func TestPeerCommitsReachTheOtherReplicasIndex(t *testing.T) {
	a, b := testPlugin(t), testPlugin(t)
	epsA, epsB := endpoints(3), endpoints(3)
	a.EndpointsChanged(epsA, nil)
	b.EndpointsChanged(epsB, nil)
	fw := &forward{to: b}
	a.PublishCommits(fw)

	serve := func(pl *Plugin, eps []*router.Endpoint, on int, question string, status int) {
		req := chatRequest(t, longSystem, question)
		pl.Prepare(context.Background(), req)
		pl.Picked(req, eps[on])
		pl.ResponseHeaders(req, eps[on], status)
		pl.Done(req, eps[on])
	}
	serve(a, epsA, 2, "failed question", 500)
	if len(fw.hashes) != 0 {
		t.Fatalf("a failed request was published: %d commits", len(fw.hashes))
	}
	serve(a, epsA, 2, "the question", 200)
	if len(fw.hashes) != 1 || !fw.applied[0] {
		t.Fatalf("commits published %d, applied %v", len(fw.hashes), fw.applied)
	}
	next := chatRequest(t, longSystem, "the question")
	b.Prepare(context.Background(), next)
	if s := scores(b, next, epsB); s[2] != 1 || s[0] != 0 || s[1] != 0 {
		t.Fatalf("the other replica scores %v, want the prompt on its endpoint 10.0.0.3 only", s)
	}
	// Commits the other way are not published: b has no publisher.
	serve(b, epsB, 0, "b's own", 200)
	if len(fw.hashes) != 1 {
		t.Fatalf("b's commit reached a's publisher")
	}
	if b.ApplyPeerCommit("10.9.9.9:8000", fw.hashes[0]) {
		t.Fatal("a commit for a server b does not have was taken")
	}
	b.EndpointsChanged(nil, epsB[2:])
	if b.ApplyPeerCommit(epsB[2].Addr, fw.hashes[0]) {
		t.Fatal("a commit for a removed server was taken")
	}
	a.PublishCommits(nil)
	serve(a, epsA, 1, "after stopping", 200)
	if len(fw.hashes) != 1 {
		t.Fatal("a published after PublishCommits(nil)")
	}
}
