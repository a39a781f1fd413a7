package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/hashcore"
)

// TensorRT-LLM publishes no ZeroMQ stream: trtllm-serve queues KV events until a POST
// /kv_cache_events drains them. kvgate must be that endpoint's only consumer (every drain
// is destructive). Its block hashes are not reproducible by kvgate, so stored tokens are
// re-hashed into kvgate's fast keys and the block map translates engine hashes for
// removals, updates and parent links.

// trtHash is a block hash as TensorRT-LLM writes it: a JSON integer, signed or unsigned.
type trtHash uint64

func (h *trtHash) UnmarshalJSON(b []byte) error {
	s := string(b)
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		*h = trtHash(u)
		return nil
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("trtllm: block hash %.40q: not a 64-bit integer", s)
	}
	*h = trtHash(uint64(i))
	return nil
}

type trtToken struct {
	TokenID uint32 `json:"token_id"`
}

type trtBlock struct {
	BlockHash  trtHash    `json:"block_hash"`
	Tokens     []trtToken `json:"tokens"`
	CacheLevel *int       `json:"cache_level"`
}

type trtDiff struct {
	New *int `json:"new_value"`
	Old *int `json:"old_value"`
}

type trtData struct {
	Type        string     `json:"type"`
	ParentHash  *trtHash   `json:"parent_hash"`
	Blocks      []trtBlock `json:"blocks"`
	BlockHashes []trtHash  `json:"block_hashes"`
	BlockHash   *trtHash   `json:"block_hash"`
	CacheLevel  *trtDiff   `json:"cache_level"`
}

// trtEvent is one element of a /kv_cache_events drain.
type trtEvent struct {
	EventID         *int64  `json:"event_id"`
	Data            trtData `json:"data"`
	WindowSize      *int    `json:"window_size"`
	AttentionDPRank *int    `json:"attention_dp_rank"`
}

// parseTRTEvents parses a drain body: a JSON list of events.
func parseTRTEvents(body []byte) ([]trtEvent, error) {
	var evs []trtEvent
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&evs); err != nil {
		return nil, fmt.Errorf("trtllm: kv_cache_events: %w", err)
	}
	for i := range evs {
		if evs[i].EventID == nil {
			return nil, fmt.Errorf("trtllm: kv_cache_events: event %d has no event_id", i)
		}
	}
	return evs, nil
}

func trtMedium(level int) Medium {
	switch level {
	case 0:
		return MediumGPU
	case 1:
		return MediumCPU
	}
	return MediumOther
}

// trtApplier applies drained TensorRT-LLM events to one endpoint.
type trtApplier struct {
	e      *endpoint
	last   int64
	keys   []uint64
	one    []uint64
	tokens []uint32
}

func newTRTApplier(e *endpoint) *trtApplier { return &trtApplier{e: e, last: -1} }

// apply applies one drain's events in order.
func (t *trtApplier) apply(evs []trtEvent) {
	e := t.e
	e.mu.Lock()
	for i := range evs {
		t.event(&evs[i])
	}
	e.mu.Unlock()
	e.noteSeq(t.last)
	e.c.batches.Inc()
}

func (t *trtApplier) seq(id int64) {
	e := t.e
	c := &e.c
	switch {
	case t.last < 0 || id == t.last+1:
	case id <= t.last:
		c.restarts.Inc()
		e.clearLocked(e.rk[0])
	case id-t.last-1 <= int64(e.m.cfg.SeqWindow):
		c.gapsKept.Inc()
	default:
		c.gapsCleared.Inc()
		e.clearLocked(e.rk[0])
	}
	t.last = id
}

func (t *trtApplier) event(ev *trtEvent) {
	e := t.e
	cfg := &e.m.cfg
	c := &e.c
	t.seq(*ev.EventID)
	d := &ev.Data
	switch d.Type {
	case "created":
		c.cleared.Inc()
		c.clearedByEngine.Inc()
		e.clearLocked(e.rk[0])
	case "stored":
		c.stored.Inc()
		t.stored(d)
	case "removed":
		c.removed.Inc()
		t.keys = t.keys[:0]
		for _, h := range d.BlockHashes {
			b := e.rk[0].blocks.get(uint64(h))
			if b == nil {
				continue
			}
			m := trtMedium(int(b.level))
			e.tiers[m].Add(-1)
			if b.hasF && cfg.Routed.Has(m) {
				t.keys = append(t.keys, b.fkey)
			}
			e.rk[0].blocks.del(uint64(h))
		}
		c.keysRemoved.Add(cfg.Inventory.Remove(e.rk[0].slot, t.keys))
	case "updated":
		if d.BlockHash == nil || d.CacheLevel == nil || d.CacheLevel.New == nil {
			return // priority-only updates do not change what is cached where
		}
		b := e.rk[0].blocks.get(uint64(*d.BlockHash))
		if b == nil || !b.hasF {
			return
		}
		from, to := trtMedium(int(b.level)), trtMedium(*d.CacheLevel.New)
		b.level = int8(min(max(*d.CacheLevel.New, 0), 100))
		e.tiers[from].Add(-1)
		e.tiers[to].Add(1)
		t.one = append(t.one[:0], b.fkey)
		switch {
		case cfg.Routed.Has(from) && !cfg.Routed.Has(to):
			c.keysRemoved.Add(cfg.Inventory.Remove(e.rk[0].slot, t.one))
		case !cfg.Routed.Has(from) && cfg.Routed.Has(to):
			c.keysAdded.Add(cfg.Inventory.Add(e.rk[0].slot, t.one))
		}
	default:
		c.unknown.Inc()
	}
}

func (t *trtApplier) stored(d *trtData) {
	e := t.e
	cfg := &e.m.cfg
	// A server whose tokens_per_block is not the endpoint's block size: adopt it (the
	// drain's blocks carry their tokens, one per position), unless pinned.
	if len(d.Blocks) > 0 && len(d.Blocks[0].Tokens) != e.ct.Load().fast.BlockSize() {
		e.adoptLocked(len(d.Blocks[0].Tokens))
	}
	fast := e.ct.Load().fast
	pf := fast.Root()
	first := true
	if d.ParentHash != nil {
		p := e.rk[0].blocks.get(uint64(*d.ParentHash))
		if p == nil || !p.hasF {
			e.c.orphans.Inc()
			return
		}
		pf, first = p.fd, false
	}
	t.keys = t.keys[:0]
	bs := fast.BlockSize()
	tokens := t.tokens[:0]
	for i := range d.Blocks {
		blk := &d.Blocks[i]
		e.noteBlockSize(len(blk.Tokens), bs)
		if len(blk.Tokens) != bs {
			e.c.unkeyable.Inc()
			break // the chain cannot continue past a block kvgate cannot key
		}
		tokens = tokens[:0]
		for _, tk := range blk.Tokens {
			tokens = append(tokens, tk.TokenID)
		}
		var dig hashcore.Digest
		t.one, dig = fast.AppendKeys(t.one[:0], pf, tokens, nil, first)
		if len(t.one) != 1 {
			break
		}
		pf, first = dig, false
		level := 0
		if blk.CacheLevel != nil {
			level = *blk.CacheLevel
		}
		b := e.rk[0].blocks.put(uint64(blk.BlockHash))
		b.fkey, b.fd, b.hasF, b.level = t.one[0], dig, true, int8(min(max(level, 0), 100))
		t.tokens = tokens
		m := trtMedium(level)
		e.tiers[m].Add(1)
		if cfg.Routed.Has(m) {
			t.keys = append(t.keys, t.one[0])
		}
	}
	e.c.keysAdded.Add(cfg.Inventory.Add(e.rk[0].slot, t.keys))
}

// trtPoller drains one trtllm-serve endpoint.
type trtPoller struct {
	e      *endpoint
	url    string
	client *http.Client
	a      *trtApplier
	body   bytes.Buffer
	// up: the last drain answered; everUp: one ever did (a later answer is a reconnect).
	// Only the poller's goroutine touches them.
	up, everUp bool
}

// markUp records that the engine answered, before its events are applied, so a status
// that shows those events also shows the endpoint connected.
func (p *trtPoller) markUp() {
	if p.up {
		return
	}
	p.up = true
	p.e.ranksUp.Add(1)
	if p.everUp {
		p.e.c.reconnects.Inc()
	}
	p.everUp = true
}

func newTRTPoller(e *endpoint) *trtPoller {
	return &trtPoller{
		e:      e,
		url:    strings.TrimRight(e.cfg.URL, "/") + "/kv_cache_events",
		client: trtClient(&e.m.cfg),
		a:      newTRTApplier(e),
	}
}

// trtClient is the drain's HTTP client: https:// endpoints are verified with cfg.TLS
// (the rule's -upstream-ca and -upstream-cert), as the proxy's forwarder verifies them.
func trtClient(cfg *Config) *http.Client {
	c := &http.Client{Timeout: cfg.HTTPTimeout}
	if cfg.TLS != nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = cfg.TLS.Clone()
		t.TLSClientConfig.NextProtos = nil // trtllm-serve speaks HTTP/1.1; let the transport negotiate
		c.Transport = t
	}
	return c
}

const maxTRTBody = 256 << 20

var errTRTStatus = errors.New("trtllm: kv_cache_events: unexpected status")

// poll drains once and returns how many events it applied.
func (p *trtPoller) poll(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("%w %d", errTRTStatus, resp.StatusCode)
	}
	p.markUp()
	p.body.Reset()
	if _, err := p.body.ReadFrom(io.LimitReader(resp.Body, maxTRTBody)); err != nil {
		return 0, err
	}
	evs, err := parseTRTEvents(p.body.Bytes())
	if err != nil {
		p.e.lostMessage(err)
		return 0, nil // the engine answered: a bad body is not a lost connection
	}
	if len(evs) > 0 {
		p.a.apply(evs)
	}
	return len(evs), nil
}

func (p *trtPoller) run(ctx context.Context) {
	cfg := &p.e.m.cfg
	log := cfg.Logger.With("endpoint", p.e.cfg.Name, "url", p.url)
	interval := cfg.BusyPoll
	delay := cfg.RetryInterval
	for ctx.Err() == nil {
		n, err := p.poll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if p.up {
				p.up = false
				p.e.ranksUp.Add(-1)
				log.Info("ingest: drain failed", "err", err)
			}
			p.e.c.dialFailures.Inc()
			if backoff(ctx, delay, p.e.wake) {
				delay = cfg.RetryInterval
				continue
			}
			delay = min(2*delay, cfg.MaxRetryInterval)
			continue
		}
		delay = cfg.RetryInterval
		if n > 0 {
			interval = cfg.BusyPoll
		} else {
			interval = min(2*interval, cfg.IdlePoll)
		}
		sleepCtx(ctx, interval)
	}
	if p.up {
		p.e.ranksUp.Add(-1)
	}
}
