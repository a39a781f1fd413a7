package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// A TensorRT-LLM endpoint behind https: ingest drains its /kv_cache_events with the
// rule's upstream TLS (-upstream-ca verifies the engine, -upstream-cert is the client
// certificate the engine demands), as the forwarder does. Without the client
// certificate the drain is refused and the endpoint shows as not connected.
func TestTRTDrainOverHTTPS(t *testing.T) {
	pki := newTestPKI(t)
	srvCert, srvKey := pki.issue("engine", "trtllm-serve")
	cliCert, cliKey := pki.issue("kvgate", "kvgate")
	caPEM, err := os.ReadFile(pki.path("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	var q enginepub.TRTQueue
	// firstGone: the first proxy has shut down. A drain it sent just before, still in the
	// server's socket or handler, must not take the event stored for the second proxy:
	// requests with a client certificate (only the first proxy has one) are answered empty
	// from then on, and the second proxy's, if any got through, still drain.
	var firstGone atomic.Bool
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/kv_cache_events":
			w.Header().Set("Content-Type", "application/json")
			if firstGone.Load() && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
				w.Write([]byte("[]"))
				return
			}
			w.Write(q.Drain(nil))
		case "/health":
		default:
			http.NotFound(w, r)
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes below
	srv.StartTLS()
	t.Cleanup(srv.Close)

	toks := engineTokens(t, sharedPrefix)
	var blocks []enginepub.TRTBlock
	for i := 0; i < 4; i++ {
		blocks = append(blocks, enginepub.TRTBlock{Hash: uint64(100 + i), Tokens: toks[i*blockSize : (i+1)*blockSize]})
	}
	q.Stored(0, false, blocks...)

	cfg := kvConfig(t, KVConverged, "name=t,url="+srv.URL+",engine=trtllm")
	cfg.Upstream.CA, cfg.Upstream.Cert, cfg.Upstream.Key = pki.path("ca.pem"), cliCert, cliKey
	s := startProxy(t, cfg)
	waitFor(t, "the https drain", func() bool { return s.kv.inv.Count(0) == 4 && s.kv.mgr.Status(0).Connected })

	// No client certificate: the engine refuses the handshake, nothing is drained.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Shutdown(ctx)
	firstGone.Store(true)
	q.Stored(103, true, enginepub.TRTBlock{Hash: 200, Tokens: toks[4*blockSize : 5*blockSize]})
	cfg2 := kvConfig(t, KVConverged, "name=t,url="+srv.URL+",engine=trtllm")
	cfg2.Upstream.CA = pki.path("ca.pem")
	s2 := startProxy(t, cfg2)
	waitFor(t, "refused drains", func() bool { return s2.kv.mgr.Status(0).DialFailures >= 2 })
	if st := s2.kv.mgr.Status(0); st.Connected || s2.kv.inv.Count(0) != 0 {
		t.Errorf("drained without a client certificate: %+v", st)
	}
	if q.Len() != 1 {
		t.Errorf("the refused drains took events: %d left", q.Len())
	}
}
