package config

import (
	"fmt"
	"net"
	"time"
)

// Shutdown configures how the picker stops (SIGTERM): readiness goes NOT_SERVING at once, new
// streams are still taken for Delay so the proxy stops sending them, then the open streams get
// up to DrainTimeout to end.
type Shutdown struct {
	Delay        Duration `json:"delay"`
	DrainTimeout Duration `json:"drainTimeout"`
}

// Kubernetes configures the picker when it follows an InferencePool (--pool-name).
type Kubernetes struct {
	LeaderElection LeaderElection `json:"leaderElection"`
}

// Peers shares what each active picker replica learns (the prompts its servers took) with
// the others (pkg/peers): with Addresses empty, nothing is shared or served.
type Peers struct {
	// Addresses are the replicas' metrics addresses, "host:port"; a host name is resolved
	// every ResolveInterval and each of its addresses followed (a headless Service gives every
	// replica). This replica's own address may be listed: it is recognised and skipped.
	Addresses []string `json:"addresses,omitempty"`
	Interval  Duration `json:"interval"`
	// Wait is how long a poll may wait at the peer for its next entry (a long poll), at most
	// 1s (pkg/peers.MaxWait); 0 polls every Interval.
	Wait            Duration `json:"wait"`
	Timeout         Duration `json:"timeout"`
	ResolveInterval Duration `json:"resolveInterval"`
	// LogBlocks bounds the commits a replica keeps for its peers, in block hashes (8 bytes).
	LogBlocks int `json:"logBlocks"`
}

// IsZero reports whether p shares nothing (no addresses): a written configuration then leaves
// it out (omitzero), whatever its timings.
func (p Peers) IsZero() bool { return len(p.Addresses) == 0 }

// LeaderElection sets the Lease timings of --ha-enable-leader-election.
type LeaderElection struct {
	LeaseDuration Duration `json:"leaseDuration"`
	RenewDeadline Duration `json:"renewDeadline"`
	RetryPeriod   Duration `json:"retryPeriod"`
}

func (c *Config) validateProcess() error {
	s, le := c.Shutdown, c.Kubernetes.LeaderElection
	switch {
	case s.Delay < 0:
		return fmt.Errorf("shutdown.delay %v: must not be negative", s.Delay.D())
	case s.DrainTimeout <= 0:
		return fmt.Errorf("shutdown.drainTimeout %v: want more than 0", s.DrainTimeout.D())
	case le.RetryPeriod <= 0:
		return fmt.Errorf("kubernetes.leaderElection.retryPeriod %v: want more than 0", le.RetryPeriod.D())
	case le.RenewDeadline <= le.RetryPeriod:
		return fmt.Errorf("kubernetes.leaderElection.renewDeadline %v: must exceed retryPeriod %v", le.RenewDeadline.D(), le.RetryPeriod.D())
	case le.LeaseDuration <= le.RenewDeadline:
		return fmt.Errorf("kubernetes.leaderElection.leaseDuration %v: must exceed renewDeadline %v", le.LeaseDuration.D(), le.RenewDeadline.D())
	}
	if p := c.Peers; len(p.Addresses) > 0 {
		switch {
		case p.Interval <= 0:
			return fmt.Errorf("peers.interval %v: want more than 0", p.Interval.D())
		case p.Wait < 0 || p.Wait.D() > time.Second:
			return fmt.Errorf("peers.wait %v: want 0 to 1s", p.Wait.D())
		case p.Timeout <= 0:
			return fmt.Errorf("peers.timeout %v: want more than 0", p.Timeout.D())
		case p.ResolveInterval <= 0:
			return fmt.Errorf("peers.resolveInterval %v: want more than 0", p.ResolveInterval.D())
		case p.LogBlocks < 1:
			return fmt.Errorf("peers.logBlocks %d: want at least 1", p.LogBlocks)
		}
		for _, a := range p.Addresses {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				return fmt.Errorf("peers.addresses: %q is not host:port", a)
			}
		}
	}
	return nil
}
