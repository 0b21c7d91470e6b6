package config

import "fmt"

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
	return nil
}
