package saturation_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/saturation"
	"github.com/kvpick/kvpick/pkg/router"
)

var now = time.Unix(1000, 0)

// scrape is what an endpoint's last scrape said; nil means none.
type scrape struct {
	waiting int
	kv      float64
	stale   bool
}

func endpoints(inflight []int64, scrapes []*scrape) []*router.Endpoint {
	eps := routertest.Endpoints(inflight...)
	for i, s := range scrapes {
		if s == nil {
			continue
		}
		m := &router.Metrics{Waiting: s.waiting, KVUsage: s.kv, HasQueue: true, HasKVUsage: true,
			ScrapedAt: now.Add(-10 * time.Millisecond), StaleAt: now.Add(time.Second)}
		if s.stale {
			m.StaleAt = now.Add(-time.Millisecond)
		}
		eps[i].SetMetrics(m)
	}
	return eps
}

func TestSaturationFilter(t *testing.T) {
	params := saturation.Params{MaxInFlightPerEndpoint: 5, MaxWaitingRequests: 100, MaxKVCacheUsage: 0.98}
	cases := []struct {
		name     string
		params   saturation.Params
		inflight []int64
		scrapes  []*scrape
		want     string // kept addresses; "" = shed
	}{
		{"in-flight limit", params, []int64{5, 4, 9}, nil, "10.0.0.2:8000"},
		{"every endpoint at its in-flight limit: shed", params, []int64{5, 6}, nil, ""},
		{"a long scraped queue excludes", params, []int64{0, 0, 0},
			[]*scrape{{waiting: 500, kv: 0.99}, {waiting: 3, kv: 0.5}, nil}, "10.0.0.2:8000,10.0.0.3:8000"},
		{"every scraped queue long: shed", params, []int64{0, 0},
			[]*scrape{{waiting: 500}, {waiting: 100}}, ""},
		{"a stale scrape is not trusted", params, []int64{0, 0},
			[]*scrape{{waiting: 500, stale: true}, {waiting: 0}}, "10.0.0.1:8000,10.0.0.2:8000"},
		{"full cache with a queue is avoided while another endpoint has no queue", params, []int64{0, 0, 0},
			[]*scrape{{waiting: 2, kv: 0.99}, {waiting: 0, kv: 0.99}, {waiting: 4, kv: 0.5}}, "10.0.0.2:8000,10.0.0.3:8000"},
		{"full cache with a queue is kept while every other endpoint queues too", params, []int64{0, 0, 0},
			[]*scrape{{waiting: 2, kv: 0.99}, {waiting: 1, kv: 0.5}, {waiting: 7, kv: 0.9}},
			"10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"},
		{"an endpoint without a scrape counts as free", params, []int64{0, 0},
			[]*scrape{{waiting: 2, kv: 0.99}, nil}, "10.0.0.2:8000"},
		{"full caches with queues everywhere: kept, no shedding", params, []int64{0, 0},
			[]*scrape{{waiting: 2, kv: 0.99}, {waiting: 5, kv: 1}}, "10.0.0.1:8000,10.0.0.2:8000"},
		{"everything disabled", saturation.Params{}, []int64{5000, 1},
			[]*scrape{{waiting: 5000, kv: 1}, nil}, "10.0.0.1:8000,10.0.0.2:8000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := saturation.New(tc.params)
			if err != nil {
				t.Fatal(err)
			}
			got := f.Filter(context.Background(), &router.Request{Now: now}, endpoints(tc.inflight, tc.scrapes))
			if a := sorted(got); a != tc.want {
				t.Fatalf("kept %q, want %q", a, tc.want)
			}
		})
	}
}

func sorted(eps []*router.Endpoint) string {
	cp := append([]*router.Endpoint(nil), eps...)
	for i := range cp {
		for j := i + 1; j < len(cp); j++ {
			if cp[j].Addr < cp[i].Addr {
				cp[i], cp[j] = cp[j], cp[i]
			}
		}
	}
	return routertest.Addrs(cp)
}

func TestSheds(t *testing.T) {
	f, _ := saturation.New(saturation.Params{MaxInFlightPerEndpoint: 1})
	if !f.Sheds() {
		t.Fatal("saturation filter must report shedding")
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []saturation.Params{{MaxInFlightPerEndpoint: -1}, {MaxWaitingRequests: -1}, {MaxKVCacheUsage: 1.5}} {
		if _, err := saturation.New(p); err == nil {
			t.Fatalf("%+v accepted", p)
		}
	}
}
