package enginesim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// DP is a data-parallel engine: one OpenAI API server in front of n engine cores (vLLM
// --data-parallel-size, SGLang --dp-size), each a whole Sim with its own KV pool,
// scheduler and event PUB socket (rank r on the base port plus r, with its rank in its
// batches). vLLM's /metrics shows each core's load (engine="r"); SGLang's here shows the
// cores' sum (no per-rank label kvgate reads). A request naming a rank in
// X-Data-Parallel-Rank goes to that core; one without goes to the least loaded (running
// + waiting, rotating on ties), as vLLM's DP load balancer does (docs/CONTRACTS.md,
// "Data-parallel ranks").
type DP struct {
	Ranks []*Sim
	ln    net.Listener
	srv   *http.Server
	rot   atomic.Uint64
}

// RankHeader is the rank hint the front reads (HTTP header names are case-insensitive).
const RankHeader = "X-Data-Parallel-Rank"

// ServedRankHeader names, on each answer, the rank that served it (for tests and demos;
// no engine sends it).
const ServedRankHeader = "X-Sim-DP-Rank"

// LaunchDP starts n engine cores from sp (Events and Replay are rank 0's ports; both
// need a fixed port, rank r binds port+r) and the front on sp.Listen.
func LaunchDP(sp Spec, n int) (*DP, error) {
	if n < 1 || n > 256 {
		return nil, fmt.Errorf("enginesim: -dp %d: want 1..256", n)
	}
	if e := sp.Engine; e != "" && e != EngineVLLM && e != EngineSGLang {
		return nil, fmt.Errorf("enginesim: -dp simulates vLLM's and SGLang's data-parallel servers; engine %q has none here", e)
	}
	listen := sp.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	d := &DP{}
	for r := 0; r < n; r++ {
		rs := sp
		rs.DPRank, rs.Listen = r, "127.0.0.1:0" // a core's own HTTP is internal: the front calls it in process
		if n > 1 {
			rs.Name = sp.Name + "#" + strconv.Itoa(r)
		}
		var err error
		if rs.Events, err = rankPort(sp.Events, r); err == nil {
			rs.Replay, err = rankPort(sp.Replay, r)
		}
		if err != nil {
			d.Close()
			return nil, err
		}
		s, err := Launch(rs)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("enginesim: rank %d: %w", r, err)
		}
		d.Ranks = append(d.Ranks, s)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		d.Close()
		return nil, err
	}
	d.ln = ln
	d.srv = &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go d.srv.Serve(ln)
	return d, nil
}

// rankPort is tcp://host:(port+r); "" stays "".
func rankPort(ep string, r int) (string, error) {
	if ep == "" || r == 0 {
		return ep, nil
	}
	const scheme = "tcp://"
	if len(ep) <= len(scheme) || ep[:len(scheme)] != scheme {
		return "", fmt.Errorf("enginesim: -dp: event endpoint %q: want tcp://host:port", ep)
	}
	h, p, err := net.SplitHostPort(ep[len(scheme):])
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || port == 0 {
		return "", fmt.Errorf("enginesim: -dp: event endpoint %q needs a fixed port (rank r publishes on port+r)", ep)
	}
	return scheme + net.JoinHostPort(h, strconv.Itoa(port+r)), nil
}

// URL is the front's base URL.
func (d *DP) URL() string { return "http://" + d.ln.Addr().String() }

// Close stops the front and every core.
func (d *DP) Close() error {
	var err error
	if d.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = d.srv.Shutdown(ctx)
		cancel()
	}
	for _, s := range d.Ranks {
		err = errors.Join(err, s.Close())
	}
	return err
}

// Handler is the API server: generation goes to one core, /metrics shows every core,
// a prefix-cache reset reaches all of them, the rest is rank 0's.
func (d *DP) Handler() http.Handler {
	mux := http.NewServeMux()
	cores := make([]http.Handler, len(d.Ranks))
	for i, s := range d.Ranks {
		cores[i] = s.Handler()
	}
	gen := func(w http.ResponseWriter, r *http.Request) {
		rank, err := d.pick(r)
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set(ServedRankHeader, strconv.Itoa(rank))
		cores[rank].ServeHTTP(w, r)
	}
	mux.HandleFunc("POST /v1/completions", gen)
	mux.HandleFunc("POST /v1/chat/completions", gen)
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		ls := make([]loadSnapshot, len(d.Ranks))
		for i, s := range d.Ranks {
			ls[i] = s.loadSnapshot()
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if d.Ranks[0].cfg.Engine == EngineSGLang {
			sum := ls[0]
			for _, l := range ls[1:] {
				sum.add(&l)
			}
			w.Write(d.Ranks[0].appendSGLangMetrics(nil, &sum))
			return
		}
		w.Write(appendVLLMCores(nil, d.Ranks, ls))
	})
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) {
		for _, s := range d.Ranks {
			s.pool.Reset()
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.Handle("/", cores[0])
	return mux
}

// pick is the core for r: the rank its header names (an integer in [0, n); vLLM ignores
// a header that is not an integer and lets its balancer choose), else the least loaded.
func (d *DP) pick(r *http.Request) (int, error) {
	if v := r.Header.Get(RankHeader); v != "" {
		if rank, err := strconv.Atoi(v); err == nil {
			if rank < 0 || rank >= len(d.Ranks) {
				return 0, badRequest("data parallel rank %d is out of range (%d ranks)", rank, len(d.Ranks))
			}
			return rank, nil
		}
	}
	n := len(d.Ranks)
	start := int(d.rot.Add(1) % uint64(n))
	best, bestLoad := -1, 0
	for j := 0; j < n; j++ {
		i := (start + j) % n
		run, wait := d.Ranks[i].sched.load()
		if best < 0 || run+wait < bestLoad {
			best, bestLoad = i, run+wait
		}
	}
	return best, nil
}

// RestartRank plays core r restarting: its cache is gone without a word, its event
// sequence starts again at 0 and its replay buffer is empty. A subscriber learns of it
// from the next batch's seq going backwards.
func (d *DP) RestartRank(r int) {
	s := d.Ranks[r]
	s.pool.forget()
	if z := s.zmq(); z != nil {
		z.Pub.SetSeq(0)
		z.Pub.ResetReplay()
	}
}
