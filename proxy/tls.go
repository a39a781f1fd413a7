package proxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
)

// Secrets and certificates come from files so they never show in a process list, and
// the files are watched: a renewed certificate or a rotated key list applies without a
// restart. A file that turns unreadable or invalid keeps the last good value, with a
// WARN, so a half-written rotation never takes the listener down.

// fileStamp identifies a file's version cheaply (size and modification time).
type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(path string) (fileStamp, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{st.Size(), st.ModTime()}, nil
}

// certSource serves the listener certificate, reloaded when -tls-cert or -tls-key change.
type certSource struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
	stamps            [2]fileStamp
	// bad are the files' stamps when they last failed to load (refused: still on disk):
	// the running certificate differs from them, which /metrics shows; they are not
	// retried, nor WARNed again, until they change.
	bad     [2]fileStamp
	refused atomic.Bool
}

func newCertSource(certFile, keyFile string) (*certSource, error) {
	c := &certSource{certFile: certFile, keyFile: keyFile}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certSource) load() error {
	s0, err0 := stampOf(c.certFile)
	s1, err1 := stampOf(c.keyFile)
	if err := errors.Join(err0, err1); err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		c.bad = [2]fileStamp{s0, s1}
		c.refused.Store(true)
		return err
	}
	c.cur.Store(&cert)
	c.stamps, c.bad = [2]fileStamp{s0, s1}, [2]fileStamp{}
	c.refused.Store(false)
	return nil
}

// changed says whether either file differs from the loaded version and from the version
// last refused.
func (c *certSource) changed() bool {
	s0, err0 := stampOf(c.certFile)
	s1, err1 := stampOf(c.keyFile)
	now := [2]fileStamp{s0, s1}
	return err0 == nil && err1 == nil && now != c.stamps && now != c.bad
}

func (c *certSource) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// serverTLS is the public listener's TLS config (HTTP/1.1 only: kvgate speaks no h2).
func (c *certSource) serverTLS() *tls.Config {
	return &tls.Config{GetCertificate: c.getCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
}

// apiKeys is the set of accepted public API keys, stored as SHA-256 digests: the check
// compares the digest of the presented key with every stored digest in constant time,
// so neither a key's bytes nor which key matched leaks through timing.
type apiKeys struct {
	path  string
	cur   atomic.Pointer[[][sha256.Size]byte]
	stamp fileStamp
	// bad and refused: as certSource's.
	bad     fileStamp
	refused atomic.Bool
}

func newAPIKeys(path string) (*apiKeys, error) {
	k := &apiKeys{path: path}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

// readAPIKeys reads one key per line; blank lines and # comments skip.
func readAPIKeys(path string) ([][sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out [][sha256.Size]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || t[0] == '#' {
			continue
		}
		if strings.ContainsAny(t, " \t") {
			return nil, fmt.Errorf("%s:%d: a key holds no spaces", path, line)
		}
		out = append(out, sha256.Sum256([]byte(t)))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no keys (one per line, # comments)", path)
	}
	return out, sc.Err()
}

func (k *apiKeys) load() error {
	st, err := stampOf(k.path)
	if err != nil {
		return err
	}
	keys, err := readAPIKeys(k.path)
	if err != nil {
		k.bad = st
		k.refused.Store(true)
		return err
	}
	k.cur.Store(&keys)
	k.stamp, k.bad = st, fileStamp{}
	k.refused.Store(false)
	return nil
}

func (k *apiKeys) changed() bool {
	st, err := stampOf(k.path)
	return err == nil && st != k.stamp && st != k.bad
}

// reloadRefused is /metrics' kvgate_reload_refused{file}: 1 while the file on disk
// failed to load and the previous version is in use.
func (s *Server) reloadRefused(f famWriter) {
	f.family("kvgate_reload_refused", "gauge")
	if s.certs != nil {
		f.sample("kvgate_reload_refused", `file="tls"`, b2u(s.certs.refused.Load()))
	}
	if s.apiKeys != nil {
		f.sample("kvgate_reload_refused", `file="api_keys"`, b2u(s.apiKeys.refused.Load()))
	}
}

var bearer = []byte("Bearer ")

// allow checks an Authorization header value. No allocation: the digest is on the stack.
func (k *apiKeys) allow(auth []byte) bool {
	tok, ok := bytes.CutPrefix(auth, bearer)
	if !ok || len(tok) == 0 {
		return false
	}
	d := sha256.Sum256(tok)
	match := 0
	for _, want := range *k.cur.Load() {
		match |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return match == 1
}

// checkAPIKey answers 401 (OpenAI's shape) unless the request carries an accepted key.
func (s *Server) checkAPIKey(c *app.RequestContext) bool {
	if s.apiKeys == nil || s.apiKeys.allow(c.Request.Header.Peek("Authorization")) {
		return true
	}
	s.m.unauthorized.Inc()
	writeError(c, 401, "invalid_request_error", "missing or invalid API key (want Authorization: Bearer <key>)")
	c.Response.Header.Set("WWW-Authenticate", `Bearer realm="kvgate"`)
	return false
}

// reloadFiles reloads the listener certificate and the API keys whose files changed
// (each second, Server.every).
func (s *Server) reloadFiles() {
	if c := s.certs; c != nil && c.changed() {
		if err := c.load(); err != nil {
			s.log.Warn("-tls-cert/-tls-key changed but do not load: keeping the previous certificate until they change again", "err", err)
		} else {
			s.log.Info("listener certificate reloaded", "cert", c.certFile)
		}
	}
	if k := s.apiKeys; k != nil && k.changed() {
		if err := k.load(); err != nil {
			s.log.Warn("-api-keys-file changed but does not load: keeping the previous keys until it changes again", "err", err)
		} else {
			s.log.Info("API keys reloaded", "file", k.path, "keys", len(*k.cur.Load()))
		}
	}
}

// UpstreamTLS is the TLS client config kvgate uses for https:// endpoints (doctor
// probes engines with the same one).
func UpstreamTLS(cfg *Config) (*tls.Config, error) { return upstreamTLS(cfg) }

// upstreamTLS is the client config for https:// endpoints: the -upstream-ca bundle
// (system roots when unset) and an optional client certificate.
func upstreamTLS(cfg *Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if cfg.Upstream.CA != "" {
		pem, err := os.ReadFile(cfg.Upstream.CA)
		if err != nil {
			return nil, refuse("-upstream-ca", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, refuse("-upstream-ca", "%s: no PEM certificate in it", cfg.Upstream.CA)
		}
		tc.RootCAs = pool
	}
	if cfg.Upstream.Cert != "" || cfg.Upstream.Key != "" {
		if cfg.Upstream.Cert == "" || cfg.Upstream.Key == "" {
			return nil, refuse("-upstream-cert", "a client certificate needs both -upstream-cert and -upstream-key")
		}
		cert, err := tls.LoadX509KeyPair(cfg.Upstream.Cert, cfg.Upstream.Key)
		if err != nil {
			return nil, refuse("-upstream-cert", "%v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
