// Package e2e is the local end-to-end suite: the picker (cmd/extproc), simulated model servers
// (cmd/simserver) and the development gateway (cmd/devgateway) run as real processes on
// loopback, and the tests talk HTTP to the gateway as a client would.
//
// Run it with `go test -race ./e2e/`; `go test -short` skips it. TestMain
// builds the three commands once into a temporary directory. Each test starts its own
// processes on free ports (simulators on 127.0.0.2, 127.0.0.3, ...: all of 127.0.0.0/8 is
// local) and kills their process groups when it ends, failed or not; the children also die
// with the test binary (Pdeathsig). A failed test prints the tail of every process's log.
//
// It is written for a loaded 2-core CI machine: every wait is a poll bounded by a generous
// timeout, and no assertion is about how long something took.
package e2e
