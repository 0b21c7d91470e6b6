// Package freeport finds free loopback ports for test and tool processes whose addresses must
// be known before they start (an API server and etcd, picker replicas that list each other).
package freeport

import "net"

// Loopback returns n distinct free loopback ports. Another process may take one before it is
// used; the caller's start then fails with a clear error rather than hanging.
func Loopback(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
