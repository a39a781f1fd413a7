package ingest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/engine"
)

// Parity states.
const (
	parityUnknown int32 = iota
	parityOK
	parityMismatch
)

var parityNames = [...]string{"unknown", "ok", "mismatch"}

// counters are an endpoint's event counters; they feed both Status and /metrics.
type counters struct {
	reconnects, dialFailures                         *metrics.Counter
	batches, replayed                                *metrics.Counter
	stored, removed, cleared, unknown                *metrics.Counter
	keysAdded, keysRemoved                           *metrics.Counter
	gapsKept, gapsCleared, restarts, clearedByEngine *metrics.Counter
	gapsFilled                                       *metrics.Counter
	modeSwitches                                     *metrics.Counter
	decodeErrors, topicSkipped, duplicates           *metrics.Counter
	protocolErrors                                   *metrics.Counter
	parityOK, parityMismatch, paritySkipped, orphans *metrics.Counter
	unkeyable                                        *metrics.Counter
	badEvents                                        [numBadReasons]*metrics.Counter
	refEvictions                                     *metrics.Counter
}

// EndpointStatus is a snapshot of one endpoint's ingest state (/debug/inventory).
type EndpointStatus struct {
	Name      string
	Engine    engine.Kind
	Index     int
	Connected bool  // every rank (or the drain) is connected
	Ranks     int   // ranks followed
	RanksUp   int   // ranks connected
	LastSeq   int64 // last seq applied, on any rank (TensorRT-LLM: event_id); -1 = none
	Parity    string
	Cause     string // the likely cause of a parity mismatch, once diagnosed
	Keys      int    // keys the endpoint holds in the inventory (every rank's)
	// RankSlots and RankKeys are each data-parallel rank's inventory slot and the keys
	// it holds there, in rank order (one entry without data parallelism).
	RankSlots, RankKeys []int
	Rehash              bool // the inventory holds kvgate's fast keys
	// Tiers counts the distinct engine block hashes each tier (GPU, CPU, STORAGE,
	// EXTERNAL, OTHER) holds, each counted once however many holders (KV cache groups,
	// duplicate blocks, offload chunks) it has. Only the routed tiers (Config.Routed,
	// GPU by default) feed the inventory.
	Tiers map[string]int64
	// RefEvictions counts hashes whose holder counts were dropped from the bounded
	// refcount table (a full set): their next removal is applied as a single holder's.
	RefEvictions uint64
	// EngineBlockSize is the smallest block size the engine's stores prove (tokens per
	// published key; 0 until a store with tokens arrives). BlockSizeMismatch: some of
	// its blocks are not a multiple of the rule's block size, so kvgate cannot key them
	// (a WARN named both sizes).
	EngineBlockSize   int
	BlockSizeMismatch bool
	// BlockSize is the block size kvgate keys the endpoint with: the endpoint's
	// block_size, else the rule's, unless BlockSizeAdopted: taken from what the engine's
	// events prove (a WARN said so). Contract names the chain.
	BlockSize        int
	BlockSizeAdopted bool
	Contract         string

	Reconnects, DialFailures, Batches, ReplayedBatches             uint64
	EventsStored, EventsRemoved, EventsCleared, EventsUnknown      uint64
	KeysAdded, KeysRemoved                                         uint64
	GapsKept, GapsCleared, Restarts, ClearedByEngine, ModeSwitches uint64
	GapsFilled                                                     uint64 // gaps closed from the replay buffer
	DecodeErrors, TopicSkipped, Duplicates                         uint64
	// ProtocolErrors counts connections (or dials) the engine's event socket broke the
	// ZMTP protocol on: not a PUB, not ZMTP 3.x, a malformed or oversize frame (a WARN
	// names the error).
	ProtocolErrors uint64
	// LastProtocolError is the last such error on any rank ("" = none since a connection
	// last ended without one).
	LastProtocolError string
	// BadEvents counts events skipped because they do not decode, by reason ("type",
	// "range"); their batches were applied otherwise.
	BadEvents                                                   map[string]uint64
	ParityOK, ParityMismatch, ParitySkipped, Orphans, Unkeyable uint64
}

// endpoint is the state every rank of one engine endpoint shares.
type endpoint struct {
	cfg  EndpointConfig
	m    *Manager
	c    counters
	set  *metrics.Set
	keys KeyMode

	ct       atomic.Pointer[contract] // the keys its events are attested and re-hashed under
	fast     atomic.Bool              // inventory holds fast keys
	parity   atomic.Int32             // parityUnknown/OK/Mismatch
	cause    atomic.Pointer[string]
	protoErr atomic.Pointer[string] // the last ZMTP protocol error (rankSub.protocolError)
	ranksUp  atomic.Int32
	lastSeq  atomic.Int64
	tiers    [numMedia]atomic.Int64

	// wake cuts a redial backoff short (Manager.Redial): one token per rank.
	wake chan struct{}
	// stop ends this endpoint's subscribers alone and wg waits for them
	// (Manager.RemoveEndpoint); series are its metric names, unregistered then.
	stop   context.CancelFunc
	wg     sync.WaitGroup
	series []string

	// mu serializes applying batches: the ranks' appliers share the endpoint's counters,
	// parity state and key mode, and a switch to re-hashed keys rebuilds every rank.
	mu sync.Mutex
	// rk is each data-parallel rank's own inventory slot, block map and holder counts:
	// ranks are separate engines with separate caches, so an eviction or a restart on
	// one must not touch what another holds.
	rk           []*rankState
	engineBS     atomic.Int64 // smallest block size the stores prove
	sizeMismatch atomic.Bool
	sizeWarned   int // the last block size WARNed about (e.mu held)
	// badWarned and badSince rate-limit the undecodable-event WARN (e.mu held).
	badWarned time.Time
	badSince  int
	// lostWarned (unix nanos) and lostAt (decodeErrors then) rate-limit the WARN about
	// messages that do not decode at all, from any of the endpoint's goroutines.
	lostWarned atomic.Int64
	lostAt     atomic.Uint64
}

// rankState is what one data-parallel rank of an endpoint holds (e.mu guards it).
type rankState struct {
	rank   int
	slot   int // the rank's inventory slot: its routed (GPU) keys
	blocks blockMap
	refs   refTable
	// tierSlot is where a block on each tier is indexed: slot for the routed tiers, the
	// rank's CPU or storage slot (EndpointConfig.CPUSlots, StorageSlots), or -1: not
	// indexed (its holders are still counted).
	tierSlot [numMedia]int
	// singles, while singlesOn, is how many hashes are held once on the GPU tier and on
	// no other: such a hash has no refs entry, its bit in slot is its one holder, and refs
	// keeps only hashes with a second holder, which under churn are few (at 100M entries
	// over 1,024 engines the tables took 2 GiB, and looking every hash up cost each key a
	// cache miss). On when the inventory reports which stores were repeats
	// (heldInventory), the GPU tier is indexed in slot and slot was empty when the rank
	// was made (every key in it is this rank's own); off for good once the endpoint
	// switches to fast keys (the slot holds other keys then) or the rank's engine
	// announces a block on another tier (an offloading engine: holders on several tiers
	// go in one entry), its singles then given entries (applier.endSingles). (A single
	// the inventory evicts at its own per-endpoint bound stays in the GPU tier count: its
	// removal finds nothing to remove, which reads as a hash never stored.)
	singles   int64
	singlesOn bool
}

// singleTier is the tier whose lone holders rankState.singles keeps.
const singleTier = MediumGPU

// keepsSingles reports whether r keeps hashes held once on tier m outside refs (e.mu
// held).
func (r *rankState) keepsSingles(m Medium) bool { return r.singlesOn && m == singleTier }

// holdsIn reports whether one of the tiers in left is indexed in slot.
func (r *rankState) holdsIn(left Media, slot int) bool {
	for m := Medium(0); m < numMedia; m++ {
		if left.Has(m) && r.tierSlot[m] == slot {
			return true
		}
	}
	return false
}

// slots appends the distinct slots r indexes into (its own first) to dst.
func (r *rankState) slots(dst []int) []int {
	dst = append(dst, r.slot)
	for _, s := range r.tierSlot {
		if s >= 0 && !slices.Contains(dst, s) {
			dst = append(dst, s)
		}
	}
	return dst
}

// keys is how many keys every rank of e holds together.
func (e *endpoint) keyCount() int {
	n := 0
	for _, r := range e.rk {
		n += e.m.cfg.Inventory.Count(r.slot)
	}
	return n
}

func metricName(base, ep, extra string) string {
	if extra != "" {
		return fmt.Sprintf(`%s{endpoint=%q,%s}`, base, ep, extra)
	}
	return fmt.Sprintf(`%s{endpoint=%q}`, base, ep)
}

// labelSafe keeps a name usable as a Prometheus label value.
func labelSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r == '\n' || r < 0x20 {
			return '_'
		}
		return r
	}, s)
}

func newEndpoint(m *Manager, cfg EndpointConfig) *endpoint {
	e := &endpoint{cfg: cfg, m: m, keys: m.cfg.Keys}
	if e.keys == KeysAuto && m.cfg.Chain == nil && cfg.Spec == nil {
		e.keys = KeysEngine // no contract to attest against: nothing could trigger a switch
	}
	e.lastSeq.Store(-1)
	e.wake = make(chan struct{}, e.ranks())
	set := m.cfg.Metrics
	if set == nil {
		set = metrics.NewSet() // private: counters still feed Status
	}
	e.set = set
	n := labelSafe(cfg.Name)
	ctr := func(base, extra string) *metrics.Counter {
		name := metricName(base, n, extra)
		e.series = append(e.series, name)
		return set.GetOrCreateCounter(name)
	}
	gauge := func(name string, f func() float64) {
		e.series = append(e.series, name)
		set.GetOrCreateGauge(name, f)
	}
	e.c = counters{
		reconnects:      ctr("kvgate_ingest_reconnects_total", ""),
		dialFailures:    ctr("kvgate_ingest_dial_failures_total", ""),
		batches:         ctr("kvgate_ingest_batches_total", ""),
		replayed:        ctr("kvgate_ingest_replayed_batches_total", ""),
		stored:          ctr("kvgate_ingest_events_total", `type="stored"`),
		removed:         ctr("kvgate_ingest_events_total", `type="removed"`),
		cleared:         ctr("kvgate_ingest_events_total", `type="cleared"`),
		unknown:         ctr("kvgate_ingest_events_total", `type="unknown"`),
		keysAdded:       ctr("kvgate_ingest_keys_added_total", ""),
		keysRemoved:     ctr("kvgate_ingest_keys_removed_total", ""),
		gapsKept:        ctr("kvgate_ingest_gaps_total", `action="kept"`),
		gapsCleared:     ctr("kvgate_ingest_gaps_total", `action="cleared"`),
		gapsFilled:      ctr("kvgate_ingest_gaps_total", `action="filled"`),
		restarts:        ctr("kvgate_ingest_clears_total", `reason="restart"`),
		clearedByEngine: ctr("kvgate_ingest_clears_total", `reason="engine"`),
		modeSwitches:    ctr("kvgate_ingest_clears_total", `reason="rehash_switch"`),
		decodeErrors:    ctr("kvgate_ingest_decode_errors_total", ""),
		topicSkipped:    ctr("kvgate_ingest_topic_skipped_total", ""),
		duplicates:      ctr("kvgate_ingest_duplicate_batches_total", ""),
		protocolErrors:  ctr("kvgate_ingest_protocol_errors_total", ""),
		parityOK:        ctr("kvgate_ingest_parity_checks_total", `result="ok"`),
		parityMismatch:  ctr("kvgate_ingest_parity_checks_total", `result="mismatch"`),
		paritySkipped:   ctr("kvgate_ingest_parity_checks_total", `result="skipped"`),
		orphans:         ctr("kvgate_ingest_orphan_events_total", ""),
		unkeyable:       ctr("kvgate_ingest_unkeyable_events_total", ""),
		refEvictions:    ctr("kvgate_ingest_refcount_evictions_total", ""),
	}
	for r := BadType; r < numBadReasons; r++ {
		e.c.badEvents[r] = ctr("kvgate_ingest_bad_events_total", `reason="`+r.String()+`"`)
	}
	if m.cfg.Metrics != nil {
		gauge(metricName("kvgate_ingest_connected", n, ""), func() float64 {
			if e.connected() {
				return 1
			}
			return 0
		})
		gauge(metricName("kvgate_ingest_parity", n, ""), func() float64 {
			return float64(e.parity.Load()) // 0 unknown, 1 ok, 2 mismatch
		})
		gauge(metricName("kvgate_ingest_rehash", n, ""), func() float64 {
			if e.fast.Load() {
				return 1
			}
			return 0
		})
		gauge(metricName("kvgate_ingest_inventory_keys", n, ""), func() float64 {
			return float64(e.keyCount())
		})
		for t := Medium(0); t < numMedia; t++ {
			t := t
			gauge(metricName("kvgate_ingest_tier_blocks", n, `medium="`+t.String()+`"`), func() float64 {
				return float64(e.tiers[t].Load())
			})
		}
	}
	// TensorRT-LLM events carry no engine key kvgate can reproduce: always re-hash.
	if cfg.Engine == engine.TRTLLM || e.keys == KeysRehash {
		e.fast.Store(true)
	}
	return e
}

func (e *endpoint) ranks() int {
	if e.cfg.Engine == engine.TRTLLM {
		return 1
	}
	return e.cfg.DP
}

func (e *endpoint) connected() bool { return int(e.ranksUp.Load()) == e.ranks() }

// noteSeq records the last seq (event_id) applied, on any rank.
func (e *endpoint) noteSeq(seq int64) { e.lastSeq.Store(seq) }

func (e *endpoint) status() EndpointStatus {
	s := EndpointStatus{
		Name: e.cfg.Name, Engine: e.cfg.Engine, Index: e.cfg.Index,
		Connected: e.connected(), Ranks: e.ranks(), RanksUp: int(e.ranksUp.Load()),
		LastSeq: e.lastSeq.Load(), Parity: parityNames[e.parity.Load()],
		Keys: e.keyCount(), Rehash: e.fast.Load(),
		Tiers: map[string]int64{},
	}
	for _, r := range e.rk {
		s.RankSlots = append(s.RankSlots, r.slot)
		s.RankKeys = append(s.RankKeys, e.m.cfg.Inventory.Count(r.slot))
	}
	if c := e.cause.Load(); c != nil {
		s.Cause = *c
	}
	for t := Medium(0); t < numMedia; t++ {
		s.Tiers[t.String()] = e.tiers[t].Load()
	}
	c := &e.c
	s.Reconnects, s.DialFailures = c.reconnects.Get(), c.dialFailures.Get()
	s.Batches, s.ReplayedBatches = c.batches.Get(), c.replayed.Get()
	s.EventsStored, s.EventsRemoved = c.stored.Get(), c.removed.Get()
	s.EventsCleared, s.EventsUnknown = c.cleared.Get(), c.unknown.Get()
	s.KeysAdded, s.KeysRemoved = c.keysAdded.Get(), c.keysRemoved.Get()
	s.GapsKept, s.GapsCleared, s.Restarts = c.gapsKept.Get(), c.gapsCleared.Get(), c.restarts.Get()
	s.GapsFilled = c.gapsFilled.Get()
	s.ClearedByEngine, s.ModeSwitches = c.clearedByEngine.Get(), c.modeSwitches.Get()
	s.DecodeErrors, s.TopicSkipped, s.Duplicates = c.decodeErrors.Get(), c.topicSkipped.Get(), c.duplicates.Get()
	s.ProtocolErrors = c.protocolErrors.Get()
	if p := e.protoErr.Load(); p != nil {
		s.LastProtocolError = *p
	}
	s.ParityOK, s.ParityMismatch, s.ParitySkipped = c.parityOK.Get(), c.parityMismatch.Get(), c.paritySkipped.Get()
	s.Orphans, s.Unkeyable = c.orphans.Get(), c.unkeyable.Get()
	s.RefEvictions = c.refEvictions.Get()
	s.EngineBlockSize, s.BlockSizeMismatch = int(e.engineBS.Load()), e.sizeMismatch.Load()
	if ct := e.ct.Load(); ct != nil {
		s.BlockSize, s.BlockSizeAdopted = ct.blockSize(), ct.adopted
		if ct.chain != nil {
			s.Contract = ct.chain.Name()
		}
	}
	s.BadEvents = map[string]uint64{}
	for r := BadType; r < numBadReasons; r++ {
		s.BadEvents[r.String()] = c.badEvents[r].Get()
	}
	return s
}

// splitTCP parses tcp://host:port.
func splitTCP(ep string) (host string, port int, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q: want tcp://host:port", ep)
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", ep, err)
	}
	if h == "" || h == "*" {
		return "", 0, fmt.Errorf("%q: name the engine's host, not a wildcard", ep)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", ep)
	}
	return h, port, nil
}

// rankAddr is the address of data-parallel rank r: the base port plus r.
func rankAddr(ep string, r int) string {
	h, p, err := splitTCP(ep)
	if err != nil {
		return ep
	}
	return "tcp://" + net.JoinHostPort(h, strconv.Itoa(p+r))
}
