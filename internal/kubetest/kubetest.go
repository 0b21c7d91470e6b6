// Package kubetest starts a real Kubernetes API server (kube-apiserver backed by etcd) on
// loopback for integration tests: no kubelet, no controller manager, no scheduler. Pods created
// through it never run; tests patch their status to make them Ready.
//
// The binaries come from hack/kube-binaries.sh, which builds them from the Go module proxy and
// caches them by version; point KUBE_ASSETS at the directory it prints:
//
//	export KUBE_ASSETS=$(hack/kube-binaries.sh)
//
// Tests that need a cluster call Require (or Start): without KUBE_ASSETS they are skipped, unless
// KUBE_ASSETS_REQUIRED=1 or CI=true is set (what `make test` and CI do), in which case they fail
// with instructions. A skip must never hide a missing cluster in CI.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kvpick/kvpick/internal/freeport"
)

// Environment variables.
const (
	// EnvAssets names the directory holding the etcd and kube-apiserver binaries.
	EnvAssets = "KUBE_ASSETS"
	// EnvRequired, set to 1, turns a missing KUBE_ASSETS from a skip into a failure.
	EnvRequired = "KUBE_ASSETS_REQUIRED"
)

// startTimeout bounds each process's start: the API server is ready in 2-4 s on an idle
// machine; a race-built test binary on a loaded 2-core machine can take several times that.
const startTimeout = 2 * time.Minute

// AssetsDir returns the directory holding etcd and kube-apiserver, from KUBE_ASSETS, or an
// error saying how to get them.
func AssetsDir() (string, error) {
	dir := os.Getenv(EnvAssets)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: run `export %s=$(hack/kube-binaries.sh)` (builds etcd and kube-apiserver once, ~10-15 min cold, then cached)", EnvAssets, EnvAssets)
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s has no executable %s: run hack/kube-binaries.sh and point %s at the directory it prints", EnvAssets, dir, b, EnvAssets)
		}
	}
	return dir, nil
}

// Required reports whether a missing cluster must fail the test rather than skip it.
func Required() bool {
	return os.Getenv(EnvRequired) == "1" || os.Getenv("CI") == "true"
}

// Require returns the assets directory, or ends the test: Fatal when Required, Skip otherwise
// (and under -short, where integration tests do not run).
func Require(t testing.TB) string {
	t.Helper()
	dir, err := AssetsDir()
	switch {
	case err == nil && testing.Short():
		t.Skip("integration test against a real API server: skipped in -short mode")
	case err == nil:
		return dir
	case Required():
		t.Fatalf("integration test needs a real API server: %v", err)
	case testing.Short():
		t.Skip("integration test against a real API server: skipped in -short mode")
	default:
		t.Skipf("integration test skipped: %v (set %s=1 to make this a failure)", err, EnvRequired)
	}
	return ""
}

// Cluster is a running etcd and kube-apiserver pair.
type Cluster struct {
	dir        string
	config     *rest.Config
	kubeconfig []byte

	etcd, apiserver *proc
	removeDir       bool // Start made dir: Stop removes it
	stopOnce        sync.Once
	stopErr         error
}

// Options say how to start a cluster.
type Options struct {
	AssetsDir string // holds etcd and kube-apiserver; "" reads KUBE_ASSETS
	Dir       string // for data, certificates and logs; "" makes a temporary directory, removed by Stop
	// ExtraAPIServerArgs are appended to the API server's flags (a repeated flag's last value wins).
	ExtraAPIServerArgs []string
}

// StartT starts a cluster for a test (see Require for when it skips or fails) and stops it
// when the test and its subtests end.
func StartT(t testing.TB) *Cluster {
	t.Helper()
	assets := Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*startTimeout)
	defer cancel()
	c, err := Start(ctx, Options{AssetsDir: assets})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the test cluster: %v", err)
		}
	})
	return c
}

// Start starts etcd and kube-apiserver on free loopback ports and returns once the API server
// reports ready. Call Stop to end both.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if o.AssetsDir == "" {
		if o.AssetsDir, err = AssetsDir(); err != nil {
			return nil, err
		}
	}
	c := &Cluster{dir: o.Dir}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kvpick-kubetest-"); err != nil {
			return nil, err
		}
		c.removeDir = true
	}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()

	// Ports are chosen free, then bound by the child: another process (a test package running
	// beside this one) may take one in between. A process that exits before it is ready is
	// retried on new ports; one that hangs is not.
	if err := retry(&c.etcd, func() error { return c.startEtcd(ctx, o.AssetsDir) }); err != nil {
		return nil, err
	}
	if err := retry(&c.apiserver, func() error { return c.startAPIServer(ctx, o.AssetsDir, o.ExtraAPIServerArgs) }); err != nil {
		return nil, err
	}
	return c, nil
}

// Config returns a client configuration with cluster-admin rights (group system:masters). Each
// call returns a fresh copy.
func (c *Cluster) Config() *rest.Config { return rest.CopyConfig(c.config) }

// Kubeconfig returns a kubeconfig file's content for the admin user.
func (c *Cluster) Kubeconfig() []byte { return bytes.Clone(c.kubeconfig) }

// KubeconfigPath returns the path of the admin kubeconfig file, for processes (a picker binary
// started with --kubeconfig, kubectl).
func (c *Cluster) KubeconfigPath() string { return filepath.Join(c.dir, "kubeconfig") }

// Client returns a typed client with admin rights.
func (c *Cluster) Client() kubernetes.Interface { return kubernetes.NewForConfigOrDie(c.Config()) }

// ImpersonatingConfig returns a client configuration that acts as the named service account,
// so a test can check what its RBAC rules allow.
func (c *Cluster) ImpersonatingConfig(namespace, serviceAccount string) *rest.Config {
	cfg := c.Config()
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + serviceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	return cfg
}

// Stop ends the API server, then etcd, and removes the temporary directory Start made. Safe to
// call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *Cluster) stop() error {
	var errs []error
	for _, p := range []*proc{c.apiserver, c.etcd} {
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	if c.removeDir {
		errs = append(errs, os.RemoveAll(c.dir))
	}
	return errors.Join(errs...)
}

func (c *Cluster) startEtcd(ctx context.Context, assets string) error {
	ports, err := freeport.Loopback(2)
	if err != nil {
		return err
	}
	// A fresh data directory: one left by a start that failed remembers its peer address.
	if err := os.RemoveAll(filepath.Join(c.dir, "etcd")); err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	p, err := startProc(filepath.Join(assets, "etcd"), filepath.Join(c.dir, "etcd.log"),
		"--name=kubetest",
		"--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kubetest="+peer,
		"--unsafe-no-fsync", // a test cluster's data need not survive a power loss
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	c.etcd = p
	c.etcd.url = client
	return p.waitHTTP(ctx, http.DefaultClient, client+"/health", "etcd")
}

func (c *Cluster) startAPIServer(ctx context.Context, assets string, extra []string) error {
	pki, err := newPKI(filepath.Join(c.dir, "pki"))
	if err != nil {
		return err
	}
	ports, err := freeport.Loopback(1)
	if err != nil {
		return err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(ports[0])
	args := []string{
		"--etcd-servers=" + c.etcd.url,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + filepath.Join(c.dir, "pki"),
		"--tls-cert-file=" + pki.serverCert, "--tls-private-key-file=" + pki.serverKey,
		"--client-ca-file=" + pki.caCert,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + pki.saKey, "--service-account-signing-key-file=" + pki.saKey,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		// No endpoint reconciler: 1.37 refuses a loopback advertise address otherwise.
		"--endpoint-reconciler-type=none",
		// No controller manager creates service-account tokens, so pods could not be created.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
	}
	p, err := startProc(filepath.Join(assets, "kube-apiserver"), filepath.Join(c.dir, "kube-apiserver.log"), append(args, extra...)...)
	if err != nil {
		return err
	}
	c.apiserver = p

	c.config = &rest.Config{
		Host: host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   pki.caPEM,
			CertData: pki.adminCertPEM,
			KeyData:  pki.adminKeyPEM,
		},
		QPS:   1000, // tests create and patch objects in bursts
		Burst: 2000,
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: pki.caPEM}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: pki.adminCertPEM, ClientKeyData: pki.adminKeyPEM}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "admin", Namespace: "default"}
	kc.CurrentContext = "kubetest"
	if c.kubeconfig, err = clientcmd.Write(*kc); err != nil {
		return err
	}
	if err := os.WriteFile(c.KubeconfigPath(), c.kubeconfig, 0o600); err != nil {
		return err
	}

	hc, err := rest.HTTPClientFor(c.config)
	if err != nil {
		return err
	}
	return p.waitHTTP(ctx, hc, host+"/readyz", "kube-apiserver")
}

// retry runs start up to three times while the process it started exited early.
func retry(p **proc, start func() error) error {
	var err error
	for range 3 {
		if err = start(); err == nil {
			return nil
		}
		if *p == nil {
			return err
		}
		select {
		case <-(*p).done: // exited: try again on other ports
			*p = nil
		default:
			return err // still running but not ready: not a port clash
		}
	}
	return err
}

// proc is a started child process whose output goes to a log file.
type proc struct {
	name, logPath, url string
	cmd                *exec.Cmd
	done               chan struct{}
	err                error
}

func startProc(bin, logPath string, args ...string) (*proc, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group, and killed with the test binary if that dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{name: filepath.Base(bin), logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// waitHTTP polls url until it answers 200, the process exits, or ctx or startTimeout ends.
func (p *proc) waitHTTP(ctx context.Context, hc *http.Client, url, what string) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, b[:n])
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v); its log:\n%s", what, p.err, p.tail())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready (last answer: %s): %w; its log:\n%s", what, last, ctx.Err(), p.tail())
		case <-tick.C:
		}
	}
}

// tail returns the end of the process's log, for error messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.logPath)
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// stop sends SIGTERM, then SIGKILL after a grace period.
func (p *proc) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return nil
}

// pki is the cluster's certificates: a CA, the API server's serving pair, an admin client pair
// (system:masters) and the service-account signing key.
type pki struct {
	caCert, serverCert, serverKey, saKey string // file paths
	caPEM, adminCertPEM, adminKeyPEM     []byte
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubetest-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      subject,
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
	}
	p := &pki{
		caCert:     filepath.Join(dir, "ca.crt"),
		serverCert: filepath.Join(dir, "apiserver.crt"),
		serverKey:  filepath.Join(dir, "apiserver.key"),
		saKey:      filepath.Join(dir, "sa.key"),
		caPEM:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}
	srvCert, srvKey, err := issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)}, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return nil, err
	}
	if p.adminCertPEM, p.adminKeyPEM, err = issue(3, pkix.Name{CommonName: "kubetest-admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	for path, b := range map[string][]byte{
		p.caCert:     p.caPEM,
		p.serverCert: srvCert,
		p.serverKey:  srvKey,
		p.saKey:      pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}),
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Logs returns the end of the API server's and etcd's logs, for a failing test's message.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, p := range []*proc{c.apiserver, c.etcd} {
		if p != nil {
			fmt.Fprintf(&b, "--- %s (%s)\n%s\n", p.name, p.logPath, p.tail())
		}
	}
	return b.String()
}
