package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/shard"
)

// The fleet simulator: one kvgate (a child `kvgate serve`, so its CPU and memory are its
// own) subscribed to N lightweight engine publishers, each a real ZeroMQ PUB socket
// speaking vLLM's event wire format (enginepub, msgpack array layout, vLLM framing):
// internal/zmtp's load-generation PUB by default, go-zeromq's with Publishers "zmq4".
//
// Per N: fill the inventory to FleetEntries(cfg, N) (key, endpoint) entries, then churn
// at EventRate batches per second per endpoint (each a BlockStored of 16 new blocks, plus
// a BlockRemoved of the endpoint's oldest 16 once it holds its share of the entries, so
// the size stays put: an engine whose cache is full), and measure while it runs:
//   - ingest CPU %: kvgate's process CPU (process_cpu_seconds_total) over the churn
//     window, percent of one core, with no request traffic;
//   - RSS (process_resident_memory_bytes) and the inventory's bytes per entry
//     (kvgate_inventory_memory_bytes / the entries kvgate reports);
//   - event lag, publish -> applied, of every batch in the churn window: each batch's ts
//     (the publisher's clock at publish, as engines stamp it) against kvgate's clock when
//     it was applied, from kvgate's kvgate_ingest_event_lag_seconds histogram (p50 and
//     p99 interpolated within its buckets, as Prometheus's histogram_quantile does);
//   - routed lag, publish -> visible to routing: a publisher sends a marker block (a fresh
//     root block of 16 random token ids, keyed with the rule's contract) in its next batch
//     and the runner sends those tokens through kvgate until it routes them to that
//     endpoint as a KV hit; an upper bound, to within one such round trip;
//   - decision latency: 8,192-token completions (token-id prompts, 512 blocks) sent
//     through kvgate to a stub engine, timed by kvgate's own stage histograms: hash +
//     score + select (DESIGN.md's decision; the full route, parse included, is kept
//     too). Three endpoints hold 384, 256 and 128 of the prompt's blocks.
//
// A quarter of the stored groups are hot chains shared by several endpoints (about
// three holders each), so the inventory holds keys of one and of many holders.

// FleetConfig configures RunFleet.
type FleetConfig struct {
	Sizes []int // fleet sizes N (endpoints), e.g. 8, 64, 256, 1024
	// Entries is the (key, endpoint) entries to reach before measuring, across the fleet,
	// the same at every size. 0: FleetEntriesAt1024 x N / 1,024 at size N (FleetEntries).
	Entries   int
	EventRate float64       // churn batches per second per endpoint
	Measure   time.Duration // churn window for ingest CPU
	Markers   int           // lag markers per N
	Decisions int           // decision requests per N
	// LoadScrape is kvgate's -kv-load-scrape (each engine's /metrics read this often;
	// 0: off). The stub engine answers it with vLLM's gauges, as a real engine would.
	LoadScrape time.Duration
	// Publishers is what the engines publish through: "zmtp" (the default, "" too):
	// internal/zmtp's load-generation PUB, which writes each batch from the engine's
	// goroutine; "zmq4": go-zeromq's PUB, a writer goroutine and queue per socket, which
	// could not generate 1M keys/s at 1,024 engines on two cores (bench/RESULTS.md).
	Publishers string
	// ProfileDir, when set, receives CPU profiles of each size's churn window:
	// kvgate-N.prof (kvgate's /debug/pprof/profile) and runner-N.prof (this process:
	// the publishers).
	ProfileDir string
	Kvgate     string    // kvgate binary
	Model      string    // served model name
	Tokenizer  string    // tokenizer directory kvgate loads for Model
	Progress   io.Writer // optional: a line per phase
	Seed       uint64
}

// FleetEntriesAt1024 is the inventory the fleet fills by default at 1,024 endpoints
// (issue 13: 100M (key, endpoint) entries); a smaller fleet gets its endpoints' share of
// it, so every size measures the same per-endpoint inventory (97,656 entries an
// endpoint: 781k at N=8, 25M at 256).
const FleetEntriesAt1024 = 100_000_000

// FleetEntries is the (key, endpoint) entries cfg fills a fleet of n endpoints to:
// cfg.Entries, or by default n endpoints' share of FleetEntriesAt1024.
func FleetEntries(cfg FleetConfig, n int) int {
	if cfg.Entries > 0 {
		return cfg.Entries
	}
	return int(int64(FleetEntriesAt1024) * int64(n) / 1024)
}

// FleetRow is one fleet size's measurements.
type FleetRow struct {
	Endpoints     int
	Entries       int64
	RSSMB         float64
	BytesPerEntry float64
	IngestCPU     float64 // percent of one core
	RunnerCPU     float64 // the runner's own CPU (publishers, load generation), percent of one core, same window
	// Steal is the host's steal over the churn window, percent of the machine's CPU time
	// (/proc/stat; -1 where it cannot be read): time the hypervisor gave these cores to
	// other guests while kvgate and the runner had work, so the lag of a window with
	// much of it is partly the host's.
	Steal          float64
	EventsPerSec   float64       // batches applied per second in the churn window
	LagP50, LagP99 time.Duration // publish -> applied, every batch of the churn window
	LagBatches     float64       // batches the lag histogram counted in the window
	// StampP50, StampP99 and StampMax are the runner's own share of the lag: from a
	// publisher stamping a batch's ts to its write returning, every churn batch of the
	// window. A publisher preempted in between counts that time as lag.
	StampP50, StampP99, StampMax time.Duration
	// SchedP99 is kvgate's goroutine scheduling latency (runnable to running, the Go
	// runtime's /sched/latencies:seconds) p99 over the window; GCs the collections that
	// ended in it, GCCPU the collector's CPU (percent of one core), PauseMax the
	// longest stop-the-world pause's bucket bound.
	SchedP99 time.Duration
	GCs      float64
	GCCPU    float64
	PauseMax time.Duration
	// RoutedP50 and RoutedP99 are the markers' publish -> routed-to-their-holder times.
	RoutedP50, RoutedP99 time.Duration
	LagLost              int           // markers never seen within fleetMarkerTimeout
	PollRTT              time.Duration // median marker poll round trip: the routed lag's resolution
	Decision             time.Duration // kvgate's hash + score + select stages, mean (DESIGN.md's decision)
	Route                time.Duration // kvgate_route_seconds mean: parse and token ids too
	Hits                 int           // decisions kvgate routed as kv-hit
}

const (
	fleetBlockSize = 16
	fleetGroup     = 16 // blocks per stored batch
	// fleetMarkerBlocks is a lag marker's length: long enough that the cost policy sends
	// its prompt to the one holder once it is applied. A one-block marker saves too little
	// prefill to beat the holder's predicted queue, so polls went elsewhere (kv-spread)
	// for up to hundreds of ms after the marker was applied, and the lag measured that.
	fleetMarkerBlocks   = 32
	fleetPromptTokens   = 8192
	fleetMarkerTimeout  = 5 * time.Second
	fleetFillTimeout    = 120 * time.Second
	fleetSharedFraction = 4 // one group in four is a shared hot chain
	fleetSharedHolders  = 3 // hot chains are sized for about this many holders each
)

// fleetSpec is the hash contract of the fleet: vLLM sha256_cbor, 16-token blocks. kvgate
// runs with the same flags, so the prompt and marker keys computed here are its keys.
var fleetSpec = hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: fleetBlockSize}

// RunFleet runs every size in cfg.Sizes and returns a row per size.
func RunFleet(ctx context.Context, cfg FleetConfig) ([]FleetRow, error) {
	if len(cfg.Sizes) == 0 {
		return nil, errors.New("fleet: no sizes")
	}
	for _, n := range cfg.Sizes {
		if n < 1 || n > 1024 {
			return nil, fmt.Errorf("fleet: size %d out of range 1..1024", n)
		}
	}
	if cfg.Entries < 0 || cfg.EventRate < 0 || cfg.Markers < 0 || cfg.Decisions < 0 {
		return nil, errors.New("fleet: entries, event rate, markers and decisions must be >= 0")
	}
	if cfg.Publishers != "" && cfg.Publishers != "zmtp" && cfg.Publishers != "zmq4" {
		return nil, fmt.Errorf("fleet: publishers %q: want zmtp or zmq4", cfg.Publishers)
	}
	if cfg.Kvgate == "" || cfg.Tokenizer == "" || cfg.Model == "" {
		return nil, errors.New("fleet: needs a kvgate binary, a model name and its tokenizer directory")
	}
	chain, err := hashcore.New(fleetSpec)
	if err != nil {
		return nil, err
	}
	var rows []FleetRow
	for _, n := range cfg.Sizes {
		row, err := runFleetSize(ctx, cfg, chain, n)
		if err != nil {
			return rows, fmt.Errorf("fleet of %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// fleetEngine is one simulated engine: a publisher and the groups it holds, oldest first.
// A group is 16 keys derived from its id: unique ids count up per engine, shared ids
// (top bit set) name a hot chain.
type fleetEngine struct {
	pub    *enginepub.Publisher
	mu     sync.Mutex
	groups []uint64 // FIFO of held group ids
	head   int      // groups[head:] are held
	next   uint64   // next unique group id
	shared []uint64 // bitset of the hot chains held (bit g&^sharedGroup): no map work a batch
	marker []uint64 // keys to add to the next batch (a lag marker)
	sent   chan time.Time
}

const sharedGroup = 1 << 63

// fleetPacers is how many goroutines publish the churn: enough that one preempted in a
// write leaves others publishing, few enough that the runner does not spend its CPU
// switching between them.
const fleetPacers = 8

// fleetChurner is one engine's churn state on its pacer.
type fleetChurner struct {
	e      int
	fe     *fleetEngine
	r      *rand.Rand
	phase  time.Duration // its offset within each period
	st, rm []uint64
}

// publish builds and publishes the engine's next batch, handing a pending lag marker's
// publish time to its waiter, and records the batch's stamp-to-written time.
func (c *fleetChurner) publish(hot uint64, keep int, stamps *durHist) error {
	fe := c.fe
	fe.mu.Lock()
	defer fe.mu.Unlock()
	sent := fe.sent
	fe.sent = nil
	var evs []enginepub.Event
	evs, c.st, c.rm = fe.step(c.e, c.r, hot, keep, c.st, c.rm)
	at := time.Now()
	d, err := fe.pub.PublishTimed(evs...)
	stamps.observe(d)
	if sent != nil {
		sent <- at
	}
	return err
}

// groupKeys writes group g's 16 keys of engine e into dst (splitmix64 of the group and
// block index: distinct 64-bit keys, none 0 in practice).
func groupKeys(dst []uint64, e int, g uint64) []uint64 {
	dst = dst[:0]
	base := g<<4 ^ uint64(e+1)<<44 // unique ids stay below 2^40
	if g&sharedGroup != 0 {
		base = (g&^sharedGroup)<<4 | 1<<60
	}
	for j := uint64(0); j < fleetGroup; j++ {
		z := (base|j)*0x9e3779b97f4a7c15 + 0x2545f4914f6cdd1d
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		dst = append(dst, z^z>>31)
	}
	return dst
}

func (fe *fleetEngine) held() int { return len(fe.groups) - fe.head }

// fleetHot is the number of hot chains for a fill of entries: sized for about
// fleetSharedHolders holders each.
func fleetHot(entries int) uint64 {
	return uint64(max(1, entries/fleetGroup/fleetSharedFraction/fleetSharedHolders))
}

// nextGroup picks the group an engine stores next: a new unique one, or one time in
// fleetSharedFraction a hot chain it does not hold yet.
func (fe *fleetEngine) nextGroup(r *rand.Rand, hot uint64) uint64 {
	if hot > 0 && r.IntN(fleetSharedFraction) == 0 {
		for try := 0; try < 4; try++ {
			if h := r.Uint64N(hot); fe.shared[h/64]&(1<<(h%64)) == 0 {
				fe.shared[h/64] |= 1 << (h % 64)
				return sharedGroup | h
			}
		}
	}
	g := fe.next
	fe.next++
	return g
}

// step builds one batch: store a group, and when the engine holds more than keep
// groups, remove its oldest; a pending marker block rides along. It returns the events
// (their slices valid until the next step of this engine) and the key buffers.
func (fe *fleetEngine) step(e int, r *rand.Rand, hot uint64, keep int, st, rm []uint64) ([]enginepub.Event, []uint64, []uint64) {
	g := fe.nextGroup(r, hot)
	st = groupKeys(st, e, g)
	fe.groups = append(fe.groups, g)
	evs := []enginepub.Event{enginepub.BlockStored{Hashes: st, BlockSize: fleetBlockSize}}
	if fe.held() > keep {
		old := fe.groups[fe.head]
		fe.head++
		if old&sharedGroup != 0 {
			h := old &^ sharedGroup
			fe.shared[h/64] &^= 1 << (h % 64)
		}
		rm = groupKeys(rm, e, old)
		evs = append(evs, enginepub.BlockRemoved{Hashes: rm})
		if fe.head > 4096 && fe.head*2 > len(fe.groups) {
			fe.groups = append(fe.groups[:0], fe.groups[fe.head:]...)
			fe.head = 0
		}
	}
	if fe.marker != nil {
		evs = append(evs, enginepub.BlockStored{Hashes: fe.marker, BlockSize: fleetBlockSize})
		fe.marker = nil
	}
	return evs, st, rm
}

func runFleetSize(ctx context.Context, cfg FleetConfig, chain hashcore.Chain, n int) (FleetRow, error) {
	row := FleetRow{Endpoints: n}
	entries := FleetEntries(cfg, n)
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "fleet %4d: "+format+"\n", append([]any{n}, a...)...)
		}
	}
	engines := make([]*fleetEngine, n)
	defer func() {
		for _, fe := range engines {
			if fe != nil {
				fe.pub.Close()
			}
		}
	}()
	for i := range engines {
		pub, err := enginepub.New(enginepub.Config{Endpoint: "tcp://127.0.0.1:0", Format: enginepub.Format{Flavor: enginepub.VLLM},
			Lightweight: cfg.Publishers != "zmq4"})
		if err != nil {
			return row, fmt.Errorf("publisher %d: %w", i, err)
		}
		engines[i] = &fleetEngine{pub: pub, shared: make([]uint64, (fleetHot(entries)+63)/64)}
	}
	stub, err := startStubEngine()
	if err != nil {
		return row, err
	}
	defer stub.Close()

	// The rule: every endpoint on the stub engine, subscribed to its publisher.
	dir, err := os.MkdirTemp("", "kvgate-fleet-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	var epf bytes.Buffer
	for i, fe := range engines {
		fmt.Fprintf(&epf, "name=e%d,url=http://%s,engine=vllm,events=%s\n", i, stub.Addr(), fe.pub.Addr())
	}
	epFile := filepath.Join(dir, "endpoints")
	if err := os.WriteFile(epFile, epf.Bytes(), 0o644); err != nil {
		return row, err
	}
	listen, err := freePort()
	if err != nil {
		return row, err
	}
	admin, err := freePort()
	if err != nil {
		return row, err
	}
	args := []string{"serve", "-listen", listen, "-admin-listen", admin, "-endpoints-file", epFile,
		"-kv-mode", "3", "-kv-block-size", strconv.Itoa(fleetBlockSize), "-kv-hash-algo", fleetSpec.Algo,
		"-model", cfg.Model, "-tokenizer", cfg.Tokenizer, "-health-interval", "0", "-log-level", "warn",
		"-kv-load-scrape", cfg.LoadScrape.String(),
		// No pending entries: a lag poll that arrived before its marker was applied would
		// otherwise make the endpoint it went to hold the marker for -kv-pending-ttl (2 s),
		// and later polls would split between that one and the marker's until rotation
		// hit the right one: the lag measured that, not the event path.
		"-kv-pending-ttl", "0",
		// No fair share: the stub engines never cache what they serve, so the decision
		// prompt, sent again and again, looks to the cost policy like a prefix whose
		// followers keep bringing prefill work, and its holder loses some of them once past
		// its share. The fleet measures the event path and what a decision costs, not
		// placement (bench's TTFT runs do, against engines that cache).
		"-kv-fair-share", "0",
		// A large -fleet-entries on a small fleet must not meet the per-endpoint bound.
		"-kv-max-keys-per-endpoint", strconv.Itoa(max(shard.DefaultMaxKeysPerEndpoint, 2*entries/n+fleetPromptTokens))}
	stop, err := startChild(ctx, cfg.Kvgate, args, "http://"+admin+"/readyz")
	if err != nil {
		return row, fmt.Errorf("kvgate: %w", err)
	}
	defer stop()
	metricsURL := "http://" + admin + "/metrics"
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for i, fe := range engines {
		if err := fe.pub.WaitSubscribed(waitCtx); err != nil {
			return row, fmt.Errorf("engine %d: no event subscriber: %v", i, err)
		}
	}
	say("%d publishers subscribed", n)

	// The decision prompt's blocks, held by three endpoints (never churned out).
	r := rand.New(rand.NewPCG(cfg.Seed, uint64(n)))
	prompt := make([]uint32, fleetPromptTokens)
	for i := range prompt {
		prompt[i] = uint32(r.IntN(151000))
	}
	pkeys := hashcore.Keys(chain, nil, prompt, nil)
	holders := []struct{ ep, blocks int }{{0, 384}, {n / 2, 256}, {n - 1, 128}}
	want := int64(0)
	for i, h := range holders {
		if slices.ContainsFunc(holders[:i], func(o struct{ ep, blocks int }) bool { return o.ep == h.ep }) {
			continue // a small fleet: the endpoint already holds a longer run
		}
		if err := publishChain(engines[h.ep].pub, pkeys[:h.blocks]); err != nil {
			return row, err
		}
		want += int64(h.blocks)
	}

	// Fill: rounds of one group per engine, waiting for kvgate to catch up every few
	// rounds. vLLM's PUB drops past its high-water mark (hwm=100_000 in
	// ZmqEventPublisher, vllm/distributed/kv_events.py @ b4e69e0a), which kvgate sees as a
	// seq gap; go-zeromq's PUB queues without bound instead: pacing keeps the queues short
	// and the fill lossless either way.
	keep := entries / n / fleetGroup
	hot := fleetHot(entries)
	var st, rm []uint64
	t0 := time.Now()
	for round := 0; round < keep; round++ {
		for e, fe := range engines {
			var evs []enginepub.Event
			evs, st, rm = fe.step(e, r, hot, keep, st, rm)
			if err := fe.pub.Publish(evs...); err != nil {
				return row, err
			}
		}
		want += int64(n * fleetGroup)
		if round%64 == 63 || round == keep-1 {
			if err := waitEntries(ctx, metricsURL, want, fleetFillTimeout); err != nil {
				return row, err
			}
		}
	}
	say("filled %d entries in %.1fs", want, time.Since(t0).Seconds())

	// Churn: each engine publishes at EventRate, phases spread over the period.
	var stamps durHist
	churnCtx, stopChurn := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var pubErr error
	var errOnce sync.Once
	if cfg.EventRate > 0 {
		// A few pacer goroutines publish for all engines (engine e on pacer e mod
		// pacers), each walking its engines in phase order and sleeping until the next
		// one is due, instead of a goroutine and a timer per engine: at 1,024 engines
		// the timers, selects and goroutine switches were a tenth of the runner's CPU,
		// on the two cores kvgate needs. A pacer that falls behind publishes what is due
		// at once (the asked rate holds); each batch is stamped just before its write.
		period := time.Duration(float64(time.Second) / cfg.EventRate)
		pacers := min(n, fleetPacers)
		start := time.Now()
		for p := 0; p < pacers; p++ {
			var mine []*fleetChurner
			for e := p; e < n; e += pacers {
				r := rand.New(rand.NewPCG(cfg.Seed^uint64(e), 7))
				mine = append(mine, &fleetChurner{e: e, fe: engines[e], r: r, phase: time.Duration(r.Int64N(int64(period)))})
			}
			slices.SortFunc(mine, func(a, b *fleetChurner) int { return int(a.phase - b.phase) })
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.NewTimer(time.Hour)
				defer t.Stop()
				for round := 0; ; round++ {
					base := start.Add(time.Duration(round) * period)
					for _, c := range mine {
						if d := time.Until(base.Add(c.phase)); d > 0 {
							t.Reset(d)
							select {
							case <-churnCtx.Done():
								return
							case <-t.C:
							}
						} else if churnCtx.Err() != nil {
							return
						}
						if err := c.publish(hot, keep, &stamps); err != nil {
							errOnce.Do(func() { pubErr = err })
							return
						}
					}
				}
			}()
		}
	}
	defer func() {
		stopChurn()
		wg.Wait()
	}()

	// Ingest CPU over the churn window, no requests.
	m0 := scrapeFleet(metricsURL)
	st0 := stamps.snapshot()
	self0 := selfCPU()
	var steal stealWindow
	steal.begin()
	stopProfiles, err := startFleetProfiles(cfg.ProfileDir, n, "http://"+admin, cfg.Measure)
	if err != nil {
		return row, err
	}
	time.Sleep(cfg.Measure)
	if err := stopProfiles(); err != nil {
		return row, err
	}
	self1 := selfCPU()
	steal.end()
	row.Steal = steal.percent()
	st1 := stamps.snapshot()
	m1 := scrapeFleet(metricsURL)
	if el := m1.at.Sub(m0.at).Seconds(); el > 0 {
		row.IngestCPU = (m1.cpu - m0.cpu) / el * 100
		row.RunnerCPU = (self1 - self0).Seconds() / el * 100
		row.EventsPerSec = (m1.batches - m0.batches) / el
		row.GCCPU = (m1.gcCPU - m0.gcCPU) / el * 100
	}
	lag0, lag1 := m0.hist[lagFamily], m1.hist[lagFamily]
	row.LagP50, row.LagP99, row.LagBatches = cumQuantile(lag0, lag1, 0.50), cumQuantile(lag0, lag1, 0.99), lag1.count()-lag0.count()
	row.SchedP99 = cumQuantile(m0.hist[schedFamily], m1.hist[schedFamily], 0.99)
	row.PauseMax = cumQuantile(m0.hist[pauseFamily], m1.hist[pauseFamily], 1)
	row.GCs = m1.gcs - m0.gcs
	row.StampP50, row.StampP99, row.StampMax = st1.quantile(st0, 0.50), st1.quantile(st0, 0.99), st1.max
	say("lag, publish -> applied: p50 %.2f ms p99 %.2f ms (%.0f batches); of it in the runner, stamp -> written: p50 %.3f ms p99 %.3f ms max %.1f ms",
		ms64(row.LagP50), ms64(row.LagP99), row.LagBatches, ms64(row.StampP50), ms64(row.StampP99), ms64(row.StampMax))
	say("churn: %.0f batches/s applied (%.0f keys/s), kvgate CPU %.1f%% (%.0f ns a key), runner CPU %.1f%%, host steal %s%%", row.EventsPerSec,
		row.EventsPerSec*2*fleetGroup, row.IngestCPU, nsPerKey(row), row.RunnerCPU, percentOrDash(row.Steal))
	say("kvgate runtime: scheduling latency p99 %.3f ms, %.0f GCs (CPU %.1f%% of a core), longest pause <= %.2f ms; %.0f inventory shard rebuilds",
		ms64(row.SchedP99), row.GCs, row.GCCPU, ms64(row.PauseMax), m1.rebuilds-m0.rebuilds)
	if row.Steal >= stealWarnPercent {
		say("WARN: host steal %.1f%% of the machine's CPU time in the churn window: the hypervisor ran other guests on these cores, so the lag above is partly the host's", row.Steal)
	}
	if n := m1.reconnects - m0.reconnects; n > 0 {
		// A publisher drops a subscriber whose socket stayed full for its send timeout
		// (zmtp.Pub: 5 s), so a starved kvgate loses events here, and its lag says so.
		say("WARN: %.0f ingest reconnects during the churn window (events were lost)", n)
	}

	// Lag markers, one at a time, on random engines.
	hc := &http.Client{Timeout: 10 * time.Second}
	proxyURL := "http://" + listen + "/v1/completions"
	var lags, rtts []time.Duration
	for m := 0; m < cfg.Markers && ctx.Err() == nil; m++ {
		e := r.IntN(n)
		toks := make([]uint32, fleetMarkerBlocks*fleetBlockSize)
		for i := range toks {
			toks[i] = uint32(r.IntN(151000))
		}
		key := hashcore.Keys(chain, nil, toks, nil)
		body, _ := json.Marshal(map[string]any{"model": cfg.Model, "prompt": toks, "max_tokens": 1})
		lag, err := markerLag(ctx, hc, proxyURL, body, engines[e], key, fmt.Sprintf("e%d", e), cfg.EventRate > 0, &rtts)
		if err != nil {
			return row, err
		}
		if lag < 0 {
			row.LagLost++
			continue
		}
		lags = append(lags, lag)
	}
	slices.Sort(lags)
	slices.Sort(rtts)
	row.RoutedP50, row.RoutedP99, row.PollRTT = Percentile(lags, 50), Percentile(lags, 99), Percentile(rtts, 50)
	say("routed lag p50 %.2f ms p99 %.2f ms (%d markers, %d lost; poll round trip p50 %.2f ms)",
		ms64(row.RoutedP50), ms64(row.RoutedP99), len(lags), row.LagLost, ms64(row.PollRTT))

	// Decisions: real requests through kvgate to the stub, timed by kvgate itself.
	body, _ := json.Marshal(map[string]any{"model": cfg.Model, "prompt": prompt, "max_tokens": 1})
	var r0 fleetScrape
	warmup := min(5, cfg.Decisions)
	for d := -warmup; d < cfg.Decisions && ctx.Err() == nil; d++ {
		if d == 0 {
			r0 = scrapeFleet(metricsURL) // after the warm-up requests (pools, connections)
			r0.stages = scrapeStages(metricsURL)
		}
		resp, err := hc.Post(proxyURL, "application/json", bytes.NewReader(body))
		if err != nil {
			return row, fmt.Errorf("decision request: %w", err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return row, fmt.Errorf("decision request: status %d", resp.StatusCode)
		}
		if d >= 0 && resp.Header.Get("x-kvgate-route") == "kv-hit" {
			row.Hits++
		}
	}
	r1 := scrapeFleet(metricsURL)
	if c := r1.routeCount - r0.routeCount; c > 0 {
		row.Route = time.Duration((r1.routeSum - r0.routeSum) / c * float64(time.Second))
	}
	s0, s1 := r0.stages, scrapeStages(metricsURL)
	var stages []string
	for _, k := range sortedKeys(s1) {
		c := s1[k].count - s0[k].count
		if c <= 0 {
			continue
		}
		mean := (s1[k].sum - s0[k].sum) / c
		stages = append(stages, fmt.Sprintf("%s %.1f", k, mean*1e6))
		if k == "hash" || k == "score" || k == "select" {
			row.Decision += time.Duration(mean * float64(time.Second))
		}
	}
	say("decision %.1f us, route %.1f us (%d of %d kv-hit; stages, us: %s)", float64(row.Decision)/1e3,
		float64(row.Route)/1e3, row.Hits, cfg.Decisions, strings.Join(stages, ", "))
	row.Entries, row.RSSMB = int64(r1.entries), r1.rss/(1<<20)
	if r1.entries > 0 {
		row.BytesPerEntry = r1.invBytes / r1.entries
	}
	stopChurn()
	wg.Wait()
	if pubErr != nil {
		return row, fmt.Errorf("publish: %w", pubErr)
	}
	return row, ctx.Err()
}

// publishChain publishes keys as stored blocks in batches of 64, a chain from a root.
func publishChain(p *enginepub.Publisher, keys []uint64) error {
	for i := 0; i < len(keys); i += 64 {
		ev := enginepub.BlockStored{Hashes: keys[i:min(i+64, len(keys))], BlockSize: fleetBlockSize}
		if i > 0 {
			ev.Parent, ev.HasParent = keys[i-1], true
		}
		if err := p.Publish(ev); err != nil {
			return err
		}
	}
	return nil
}

// markerLag hands engine fe a marker block for its next batch (or publishes it at once
// when nothing churns) and sends the marker's 16 tokens through kvgate until it routes
// them to that endpoint as a KV hit (only it holds the block): the lag, or -1 when that
// never happens within fleetMarkerTimeout. A completion through the proxy costs the same
// at every fleet size, where /debug/explain's per-endpoint maps grow with it. rtts
// collects the round trips, the lag's resolution.
func markerLag(ctx context.Context, hc *http.Client, url string, body []byte, fe *fleetEngine, key []uint64, name string, churning bool, rtts *[]time.Duration) (time.Duration, error) {
	sent := make(chan time.Time, 1)
	fe.mu.Lock()
	if churning {
		fe.marker, fe.sent = key, sent
		fe.mu.Unlock()
	} else {
		t := time.Now()
		err := fe.pub.Publish(enginepub.BlockStored{Hashes: key, BlockSize: fleetBlockSize})
		fe.mu.Unlock()
		if err != nil {
			return 0, err
		}
		sent <- t
	}
	var t0 time.Time
	select {
	case t0 = <-sent:
	case <-time.After(fleetMarkerTimeout):
		return -1, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	for time.Since(t0) < fleetMarkerTimeout {
		start := time.Now()
		resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, fmt.Errorf("marker request: %w", err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		*rtts = append(*rtts, time.Since(start))
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("marker request: status %d", resp.StatusCode)
		}
		if resp.Header.Get("x-kvgate-route") == "kv-hit" && resp.Header.Get("x-kvgate-endpoint") == name {
			return time.Since(t0), nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	return -1, nil
}

// fleetScrape is what one /metrics read reports.
type fleetScrape struct {
	at                   time.Time
	cpu, rss             float64
	entries, invBytes    float64
	batches              float64
	routeSum, routeCount float64
	stages               map[string]stageSum
	gcs, gcCPU           float64 // GC cycles and the collector's CPU seconds so far
	reconnects           float64 // ingest's redials after a lost connection, all engines
	rebuilds             float64 // inventory shard table rebuilds (each under its shard's mutex)
	// hist holds the histograms the fleet reads (lagFamily, schedFamily, pauseFamily).
	hist map[string]*cumHist
}

// The histogram families the fleet reads from kvgate's /metrics.
const (
	lagFamily   = "kvgate_ingest_event_lag_seconds"
	schedFamily = "go_sched_latencies_seconds"
	pauseFamily = "go_gc_pauses_seconds"
)

// cumHist is one histogram's buckets as scraped: upper bounds and cumulative counts, in
// exposition order (ascending, +Inf last).
type cumHist struct{ le, cum []float64 }

func (h *cumHist) count() float64 {
	if h == nil || len(h.cum) == 0 {
		return 0
	}
	return h.cum[len(h.cum)-1]
}

// cumQuantile is the q-quantile of the observations between scrapes a and b of one
// histogram, linear within the bucket it falls in (0 when none was observed; the largest
// finite bound when it falls in +Inf). a nil: everything b counts.
func cumQuantile(a, b *cumHist, q float64) time.Duration {
	if b == nil || len(b.cum) == 0 || a != nil && len(a.cum) != len(b.cum) {
		return 0
	}
	delta := func(i int) float64 {
		if a == nil {
			return b.cum[i]
		}
		return b.cum[i] - a.cum[i]
	}
	n := delta(len(b.cum) - 1)
	if n <= 0 {
		return 0
	}
	rank := q * n
	lo, below := 0.0, 0.0
	for i, le := range b.le {
		c := delta(i)
		if c >= rank {
			if math.IsInf(le, 1) {
				return time.Duration(lo * float64(time.Second))
			}
			frac := 1.0
			if c > below {
				frac = (rank - below) / (c - below)
			}
			return time.Duration((lo + (le-lo)*frac) * float64(time.Second))
		}
		lo, below = le, c
	}
	return time.Duration(lo * float64(time.Second))
}

func scrapeFleet(url string) fleetScrape {
	s := fleetScrape{at: time.Now()}
	scrapeLines(url, func(l string) {
		sp := strings.LastIndexByte(l, ' ')
		if sp < 0 || strings.HasPrefix(l, "#") {
			return
		}
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			return
		}
		name := l[:sp]
		labels := ""
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name, labels = name[:i], name[i:]
		}
		if fam, ok := strings.CutSuffix(name, "_bucket"); ok && (fam == lagFamily || fam == schedFamily || fam == pauseFamily) {
			le, ok := strings.CutPrefix(labels, `{le="`)
			if !ok {
				return
			}
			bound, err := strconv.ParseFloat(strings.TrimSuffix(le, `"}`), 64) // "+Inf" parses
			if err != nil {
				return
			}
			if s.hist == nil {
				s.hist = map[string]*cumHist{}
			}
			h := s.hist[fam]
			if h == nil {
				h = &cumHist{}
				s.hist[fam] = h
			}
			h.le, h.cum = append(h.le, bound), append(h.cum, v)
			return
		}
		switch name {
		case "go_gc_duration_seconds_count":
			s.gcs = v
		case "go_gc_cpu_seconds_total":
			s.gcCPU = v
		case "process_cpu_seconds_total":
			s.cpu = v
		case "process_resident_memory_bytes":
			s.rss = v
		case "kvgate_ingest_inventory_keys":
			s.entries += v
		case "kvgate_inventory_memory_bytes":
			s.invBytes = v
		case "kvgate_ingest_batches_total":
			s.batches += v
		case "kvgate_ingest_reconnects_total":
			s.reconnects += v
		case "kvgate_inventory_rebuilds_total":
			s.rebuilds = v
		case "kvgate_route_seconds_sum":
			s.routeSum = v
		case "kvgate_route_seconds_count":
			s.routeCount = v
		}
	})
	return s
}

// waitEntries waits until kvgate reports at least want entries.
func waitEntries(ctx context.Context, url string, want int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got := scrapeFleet(url).entries
		if int64(got) >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvgate holds %d entries after %v, want %d", int64(got), timeout, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stubEngine answers every completion at once with a one-token OpenAI body: the fleet's
// engines, which only need to exist for kvgate to forward decisions to.
type stubEngine struct {
	ln  net.Listener
	srv *http.Server
}

func startStubEngine() (*stubEngine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	const answer = `{"id":"cmpl-fleet","object":"text_completion","model":"fleet","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":8192,"completion_tokens":1,"total_tokens":8193}}`
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			// vLLM's load gauges (docs/CONTRACTS.md, "Engine load metrics"): kvgate's
			// -kv-load-scrape reads a report, as from a real idle engine.
			io.WriteString(w, stubMetrics) //nolint:errcheck
			return
		}
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer) //nolint:errcheck
	})}
	go srv.Serve(ln) //nolint:errcheck
	return &stubEngine{ln: ln, srv: srv}, nil
}

const stubMetrics = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"fleet\"} 0\n" +
	"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"fleet\"} 0\n" +
	"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"fleet\"} 0.5\n"

func (s *stubEngine) Addr() string { return s.ln.Addr().String() }
func (s *stubEngine) Close() error { return s.srv.Close() }

// WriteFleetTable writes the rows as a markdown table.
func WriteFleetTable(w io.Writer, rows []FleetRow) {
	fmt.Fprintln(w, "| endpoints | entries | RSS MB | B/entry | ingest CPU % | lag p50 ms | lag p99 ms | decision us | routed lag p50 ms | routed lag p99 ms | host steal % |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		lost := ""
		if r.LagLost > 0 {
			lost = fmt.Sprintf(" (%d lost)", r.LagLost)
		}
		fmt.Fprintf(w, "| %d | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %.2f | %.2f%s | %s |\n", r.Endpoints, r.Entries, r.RSSMB,
			r.BytesPerEntry, r.IngestCPU, ms64(r.LagP50), ms64(r.LagP99), float64(r.Decision)/1e3,
			ms64(r.RoutedP50), ms64(r.RoutedP99), lost, percentOrDash(r.Steal))
	}
}

// WriteFleetPlots writes one SVG per measurement against the fleet size into dir and
// returns the file names.
func WriteFleetPlots(dir string, rows []FleetRow) ([]string, error) {
	return WriteFleetPlotsAs(dir, "svg", rows)
}

// WriteFleetPlotsAs is WriteFleetPlots in another format gonum/plot supports (png, pdf).
func WriteFleetPlotsAs(dir, ext string, rows []FleetRow) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	type series struct {
		label string
		y     func(FleetRow) float64
	}
	var names []string
	for _, f := range []struct {
		file, title, ylabel string
		lines               []series
	}{
		{"fleet-rss", "kvgate RSS", "MB", []series{{"RSS", func(r FleetRow) float64 { return r.RSSMB }}}},
		{"fleet-bytes-per-entry", "Inventory bytes per (key, endpoint) entry", "B/entry",
			[]series{{"B/entry", func(r FleetRow) float64 { return r.BytesPerEntry }}}},
		{"fleet-ingest-cpu", "kvgate CPU while churning (no requests)", "% of one core",
			[]series{{"CPU", func(r FleetRow) float64 { return r.IngestCPU }}}},
		{"fleet-lag", "Event lag, publish to applied", "ms", []series{
			{"p50", func(r FleetRow) float64 { return ms64(r.LagP50) }},
			{"p99", func(r FleetRow) float64 { return ms64(r.LagP99) }},
			{"routed p99", func(r FleetRow) float64 { return ms64(r.RoutedP99) }}}},
		{"fleet-decision", "Decision (parse, hash, score, select), 8,192 tokens", "us",
			[]series{{"mean", func(r FleetRow) float64 { return float64(r.Decision) / 1e3 }}}},
		{"fleet-entries", "Inventory entries", "entries",
			[]series{{"entries", func(r FleetRow) float64 { return float64(r.Entries) }}}},
	} {
		p := plot.New()
		p.Title.Text = f.title
		p.X.Label.Text = "endpoints (log scale)"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = sizeTicks(rows)
		p.Legend.Top, p.Legend.Left = true, true
		p.Y.Label.Text = f.ylabel
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		for i, s := range f.lines {
			xy := make(plotter.XYs, len(rows))
			for j, r := range rows {
				xy[j].X, xy[j].Y = float64(r.Endpoints), s.y(r)
			}
			l, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				return names, fmt.Errorf("%s: %w", f.file, err)
			}
			l.Color = plotutil.Color(i)
			pts.Color = plotutil.Color(i)
			p.Add(l, pts)
			if len(f.lines) > 1 {
				p.Legend.Add(s.label, l, pts)
			}
		}
		file := f.file + "." + ext
		if err := p.Save(6*vg.Inch, 3.5*vg.Inch, filepath.Join(dir, file)); err != nil {
			return names, fmt.Errorf("%s: %w", file, err)
		}
		names = append(names, file)
	}
	return names, nil
}

// sizeTicks labels the x axis at the fleet sizes measured.
type sizeTicks []FleetRow

func (s sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for _, r := range s {
		if v := float64(r.Endpoints); v >= lo && v <= hi {
			ts = append(ts, plot.Tick{Value: v, Label: strconv.Itoa(r.Endpoints)})
		}
	}
	return ts
}

// durHist counts durations into fixed buckets, lock-free: the publishers' stamp-to-written
// times, observed from every engine's goroutine.
type durHist struct {
	counts [len(durBounds) + 1]atomic.Uint64
	max    atomic.Int64
}

// durBounds are durHist's upper bounds: a write returns in microseconds; a publisher
// preempted between stamp and write takes a scheduler quantum or more.
var durBounds = [...]time.Duration{5 * time.Microsecond, 10 * time.Microsecond, 25 * time.Microsecond,
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, time.Second}

func (h *durHist) observe(d time.Duration) {
	i := len(durBounds)
	for j, b := range durBounds {
		if d <= b {
			i = j
			break
		}
	}
	h.counts[i].Add(1)
	for m := h.max.Load(); int64(d) > m && !h.max.CompareAndSwap(m, int64(d)); m = h.max.Load() {
	}
}

// durSnap is a durHist read at one moment, as cumulative counts.
type durSnap struct {
	h   cumHist
	max time.Duration
}

func (h *durHist) snapshot() durSnap {
	s := durSnap{h: cumHist{le: make([]float64, len(h.counts)), cum: make([]float64, len(h.counts))}, max: time.Duration(h.max.Load())}
	var run uint64
	for i := range h.counts {
		run += h.counts[i].Load()
		s.h.cum[i] = float64(run)
		if i < len(durBounds) {
			s.h.le[i] = durBounds[i].Seconds()
		} else {
			s.h.le[i] = math.Inf(1)
		}
	}
	return s
}

// quantile is the q-quantile of what was observed between snapshot a and s.
func (s durSnap) quantile(a durSnap, q float64) time.Duration { return cumQuantile(&a.h, &s.h, q) }

// nsPerKey is kvgate's CPU per applied key (stored or removed) in the churn window.
func nsPerKey(r FleetRow) float64 {
	keys := r.EventsPerSec * 2 * fleetGroup
	if keys <= 0 {
		return 0
	}
	return r.IngestCPU / 100 * 1e9 / keys
}

// startFleetProfiles starts the churn window's CPU profiles of fleet size n into dir
// (none when dir is ""): kvgate's (kvgate-N.prof), fetched from its admin listener for
// d, and this process's (runner-N.prof). The stop
// function ends this process's profile and waits for kvgate's.
func startFleetProfiles(dir string, n int, admin string, d time.Duration) (func() error, error) {
	if dir == "" {
		return func() error { return nil }, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rf, err := os.Create(filepath.Join(dir, fmt.Sprintf("runner-%d.prof", n)))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(rf); err != nil {
		rf.Close()
		return nil, err
	}
	secs := max(1, int(d.Seconds()))
	kerr := make(chan error, 1)
	go func() {
		hc := &http.Client{Timeout: d + 30*time.Second}
		resp, err := hc.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", admin, secs))
		if err != nil {
			kerr <- err
			return
		}
		defer resp.Body.Close()
		kf, err := os.Create(filepath.Join(dir, fmt.Sprintf("kvgate-%d.prof", n)))
		if err == nil {
			_, err = io.Copy(kf, resp.Body)
			if cerr := kf.Close(); err == nil {
				err = cerr
			}
		}
		kerr <- err
	}()
	return func() error {
		pprof.StopCPUProfile()
		rerr := rf.Close()
		if err := <-kerr; err != nil {
			return fmt.Errorf("kvgate profile: %w", err)
		}
		return rerr
	}, nil
}
