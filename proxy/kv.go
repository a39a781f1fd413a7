package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/ingest"
	"github.com/kvgate/kvgate/proxy/balance"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/proxy/route"
	"github.com/kvgate/kvgate/shard"
	"github.com/kvgate/kvgate/tokenize"
)

// kvRouter is KV-Exact: it turns a request into the engine's block keys (template,
// tokenizer, hash chain), scores them against every endpoint's mirrored inventory and
// picks the best overlap under the guard ladder.
type kvRouter struct {
	s         *Server
	pool      *tokenize.Pool
	inv       *shard.Inventory
	chain     hashcore.Chain // the engines' contract; nil when every endpoint is re-hashed
	fast      hashcore.Chain // kvgate's own keys (TensorRT-LLM, failed parity, -kv-keys rehash)
	mgr       eventSource    // ingest's subscribers, or the event plane (plane.go)
	mode      shard.Mode
	blockSize int
	minBlocks int32 // -kv-min-match-tokens in whole blocks: a shallower match is a miss
	lora      map[string]loraAdapter
	trie      *prefixTrie // mode 1 with -pd-prefix-trie-keys > 0; mode 3 with -kv-pending-ttl > 0
	sel       route.Selector
	popular   *route.Popularity    // the cost policy's hot-prefix sketch; nil for overlap
	memo      *tokenize.Memo       // -tokenize-memo-bytes > 0
	render    *tokenize.RenderMemo // -render-memo-bytes > 0
	chainMemo *hashcore.ChainMemo  // -kv-chain-memo-bytes > 0 and an engine contract
	// loadOnMiss: mode 3 with the cost policy and -select rr places a keyed prompt no
	// endpoint holds by the cost policy too (route kv-miss:<reason> all the same); rr
	// knows nothing of queues. -select chwbl keeps its content affinity for misses.
	loadOnMiss bool
	// foldTrie: the cost policy counts what kvgate sent (prefix trie, pending entries) as
	// held when it predicts uncached tokens.
	foldTrie bool
	// ranks places each (endpoint, data-parallel rank) in its own inventory slot; the
	// inventory, the trie, the scores and the policy all work in slots, and a winning
	// slot names both the endpoint and the rank to hint (ranks.go).
	ranks *rankLayout
	// slotLoads and slotQueues are the policy's per-slot in-flight counts and queues:
	// the server's own (per endpoint) without data parallelism, per rank with it.
	slotLoads  *balance.Loads
	slotQueues *route.Queues
	// groupMemos are the chain memos of the other contracts endpoints are keyed under
	// (hashcore.Chain -> *groupMemo), made on first use, each bounded by
	// -kv-chain-memo-bytes like the rule's.
	groupMemos sync.Map
	// keyed is the slots' classification by the keys their inventory holds (keyedSlots).
	keyed atomic.Pointer[slotKeys]
}

// slotKeys is which keys each inventory slot's endpoint is indexed by (chainOf), as of one
// KeyGen of the event source: the rule's contract, kvgate's fast keys, or another
// contract or block size. Why a snapshot: the request path splits the eligible slots by
// it on every request, and asking the source for every endpoint (two interface calls and
// a few dependent loads each) cost ~20 us at 1,024 endpoints (bench/RESULTS.md, session 8),
// where the split by masks is a few word ANDs. It is rebuilt when KeyGen moves (an
// endpoint added or removed, a block size adopted, a switch to fast keys).
type slotKeys struct {
	gen       uint64
	eng, fast shard.Mask  // slots keyed by the rule's contract, by kvgate's fast keys
	other     []slotChain // the rest, in slot order
}

type slotChain struct {
	slot  int
	chain hashcore.Chain
}

// keyedSlots returns the slots' classification, redone when the source's KeyGen moved
// (read before the endpoints are asked, so a change during the redo moves it again).
func (k *kvRouter) keyedSlots() *slotKeys {
	gen := k.mgr.KeyGen()
	if c := k.keyed.Load(); c != nil && c.gen == gen {
		return c
	}
	n := len(k.ranks.ep)
	c := &slotKeys{gen: gen, eng: shard.NewMask(n), fast: shard.NewMask(n)}
	for sl, i := range k.ranks.ep {
		switch ch := k.chainOf(int(i)); ch {
		case k.fast:
			c.fast.Set(sl)
		case k.chain:
			c.eng.Set(sl)
		default:
			c.other = append(c.other, slotChain{sl, ch})
		}
	}
	k.keyed.Store(c)
	return c
}

// groupMemo holds a key group's chain memo; nil m: the chain is not memoized (kvgate's
// fast keys, cheaper to hash than to look up; or memos are off).
type groupMemo struct{ m *hashcore.ChainMemo }

// groupKeys appends the prompt's keys under key group chain c to dst, through c's memo.
func (k *kvRouter) groupKeys(c hashcore.Chain, dst []uint64, tokens []uint32, ex *hashcore.Extras) []uint64 {
	v, ok := k.groupMemos.Load(c)
	if !ok {
		gm := &groupMemo{}
		if b := k.s.cfg.KV.ChainMemoBytes; b > 0 && c.Name() != "kvgate/fast" {
			gm.m, _ = hashcore.NewChainMemo(c, b) // b was validated at start
		}
		v, _ = k.groupMemos.LoadOrStore(c, gm)
	}
	if m := v.(*groupMemo).m; m != nil {
		dst, _ = m.AppendKeysHit(dst, tokens, ex)
		return dst
	}
	return hashcore.Keys(c, dst, tokens, ex)
}

type loraAdapter struct{ name, base string }

func newKVRouter(s *Server, pool *tokenize.Pool) (*kvRouter, error) {
	cfg := &s.cfg
	k := &kvRouter{s: s, pool: tokenize.NewPool(), blockSize: cfg.KV.BlockSize, mode: shard.Overlap,
		minBlocks: int32((cfg.KV.MinMatchTokens + cfg.KV.BlockSize - 1) / cfg.KV.BlockSize),
		lora:      map[string]loraAdapter{}}
	if cfg.KV.ScorePrefix {
		k.mode = shard.Prefix
	}
	if pool != nil {
		k.pool = pool
	}
	for _, t := range cfg.Models.Tokenizers {
		if pool != nil {
			if k.pool.Get(t.Model) == nil {
				return nil, refuse("-tokenizer", "%s: not in the given tokenizer pool", t.Model)
			}
			continue
		}
		if err := k.pool.Add(t.Model, t.Dir, t.Aliases...); err != nil {
			return nil, refuse("-tokenizer", "%s=%s: %v", t.Model, t.Dir, err)
		}
	}
	if cfg.Models.TokenizeMemoBytes > 0 {
		m, err := tokenize.NewMemo(cfg.Models.TokenizeMemoBytes)
		if err != nil {
			return nil, refuse("-tokenize-memo-bytes", "%v", err)
		}
		k.memo = m
		for _, t := range cfg.Models.Tokenizers {
			if mdl := k.pool.Get(t.Model); mdl != nil {
				if why := mdl.Tokenizer().MemoUnsupported(); why != "" {
					s.log.Info("tokenize memo off for this model", "model", t.Model, "why", why)
				}
			}
		}
	}
	if cfg.Models.RenderMemoBytes > 0 {
		var err error
		if k.render, err = tokenize.NewRenderMemo(cfg.Models.RenderMemoBytes); err != nil {
			return nil, refuse("-render-memo-bytes", "%v", err)
		}
	}
	for a, base := range cfg.Models.LoRA {
		k.lora[a] = loraAdapter{name: a, base: base}
	}
	k.ranks = s.ranks
	k.slotLoads, k.slotQueues = s.loads, s.queues
	if k.ranks.ranked {
		k.slotLoads = balance.NewLoads(k.ranks.cands)
		k.slotQueues = route.NewQueues(k.ranks.cands, cfg.KV.PrefillRate, cfg.KV.EngineSlots, 3*s.scrapeEvery)
	}
	inv, err := shard.New(shard.Config{Endpoints: k.ranks.slots(), MaxKeysPerEndpoint: cfg.KV.MaxKeysPerEndpoint})
	if err != nil {
		return nil, fmt.Errorf("proxy: inventory: %w", err)
	}
	k.inv = inv
	switch {
	case cfg.KV.Mode == KVDisaggregated && cfg.PD.PrefixTrieKeys > 0:
		k.trie, err = newPrefixTrie(k.ranks.cands, cfg.PD.PrefixTrieKeys, 0)
	case cfg.KV.Mode == KVConverged && cfg.KV.PendingTTL > 0 && cfg.KV.Policy == "cost":
		k.trie, err = newPrefixTrie(k.ranks.cands, cfg.PD.PrefixTrieKeys, cfg.KV.PendingTTL)
	}
	if err != nil {
		return nil, fmt.Errorf("proxy: prefix trie: %w", err)
	}
	if cfg.KV.Policy == "overlap" {
		k.sel = &route.Overlap{Loads: k.slotLoads, LoadFactor: cfg.KV.LoadFactor}
	} else {
		if cfg.KV.FairShare > 0 { // only the fair share reads the followers sketch
			k.popular = route.NewPopularity(cfg.KV.BlockSize)
		}
		k.sel = &route.Cost{Loads: k.slotLoads, Queues: k.slotQueues, Popular: k.popular, FairShare: cfg.KV.FairShare}
		k.loadOnMiss = cfg.KV.Mode == KVConverged && cfg.Select.Kind == SelectRR
		k.foldTrie = k.trie != nil
	}
	k.fast = hashcore.NewFast(cfg.KV.BlockSize)
	// The rule's contract: the first vLLM or SGLang endpoint's at -kv-block-size (the
	// chain memo's; endpoints of another contract or block size get their own).
	var spec *hashcore.Spec
	for _, e := range cfg.Fleet.Endpoints {
		if e.Engine == EngineVLLM || e.Engine == EngineSGLang {
			e.BlockSize = 0
			spec = endpointContract(cfg, e)
			break
		}
	}
	if spec != nil {
		c, err := hashcore.New(*spec)
		if err != nil {
			return nil, refuse(hashFlag(err), "%v", err)
		}
		k.chain = c
		if cfg.KV.ChainMemoBytes > 0 {
			if k.chainMemo, err = hashcore.NewChainMemo(c, cfg.KV.ChainMemoBytes); err != nil {
				return nil, refuse("-kv-chain-memo-bytes", "%v", err)
			}
		}
	}
	keys, err := ingest.ParseKeyMode(cfg.KV.Keys)
	if err != nil {
		return nil, refuse("-kv-keys", "%v", err)
	}
	eps := make([]ingest.EndpointConfig, len(cfg.Fleet.Endpoints))
	for i, e := range cfg.Fleet.Endpoints {
		if eps[i], err = k.ingestEndpoint(cfg, e, i); err != nil {
			return nil, err
		}
	}
	mgr, err := k.newEventSource(ingest.Config{Inventory: inv, Slots: len(s.roster().eps), Chain: k.chain, Spec: spec, Fast: k.fast,
		Keys: keys, Logger: s.log, Metrics: s.m.set, TLS: s.upTLS}, eps)
	if err != nil {
		return nil, err
	}
	k.mgr = mgr
	return k, nil
}

// hashFlag is the serve flag to blame for a contract hashcore.New refused: the seed's or
// the block size's, else the algo's (the engine kind is always vllm or sglang here).
func hashFlag(err error) string {
	var pe *hashcore.ParamError
	if errors.As(err, &pe) {
		switch pe.Param {
		case hashcore.ParamSeed:
			return "-kv-hash-seed"
		case hashcore.ParamBlockSize:
			return "-kv-block-size"
		}
	}
	return "-kv-hash-algo"
}

// ingestEndpoint is what ingest follows of endpoint e in slot i: its engine's contract at
// its block size, its ranks' and lower tiers' inventory slots.
func (k *kvRouter) ingestEndpoint(cfg *Config, e EndpointSpec, i int) (ingest.EndpointConfig, error) {
	cpuSlots, stoSlots := k.ranks.tierSlots(i)
	es := endpointContract(cfg, e)
	if es != nil {
		if _, err := hashcore.New(*es); err != nil {
			return ingest.EndpointConfig{}, refuse("-endpoint", "%s: %v", e.Name, err)
		}
	}
	return ingest.EndpointConfig{Name: e.Name, Index: i, Engine: e.Engine,
		Events: e.Events, Replay: e.Replay, DP: e.DP, RankSlots: k.ranks.rankSlots(i),
		CPUSlots: cpuSlots, StorageSlots: stoSlots, Topic: e.Topic, URL: e.URL,
		Spec: es, FixedBlockSize: e.BlockSize > 0}, nil
}

func (k *kvRouter) start(ctx context.Context) error { return k.mgr.Start(ctx) }
func (k *kvRouter) close()                          { k.mgr.Close() }

func (k *kvRouter) inventory(i int) (keys int, parity string, connected bool, lastSeq int64) {
	st := k.mgr.Status(i)
	for r := 0; r < int(k.ranks.dp[i]); r++ {
		keys += k.inv.Count(k.ranks.slot(i, r))
	}
	return keys, st.Parity, st.Connected, st.LastSeq
}

// endpointContract is endpoint e's own contract: its engine's hash at its block_size (the
// rule's -kv-block-size when unset), so a rule mixing vLLM, SGLang and TensorRT-LLM keys
// each the way its engine does. nil: the rule's (a TensorRT-LLM endpoint without
// block_size, whose keys are kvgate's fast chain at the rule's block size).
func endpointContract(cfg *Config, e EndpointSpec) *hashcore.Spec {
	bs := cfg.KV.BlockSize
	if e.BlockSize > 0 {
		bs = e.BlockSize
	}
	switch e.Engine {
	case EngineVLLM:
		return &hashcore.Spec{Engine: "vllm", Algo: cfg.KV.HashAlgo, BlockSize: bs, Seed: cfg.KV.HashSeed, SeedSet: cfg.KV.HashSeedSet}
	case EngineSGLang:
		algo := cfg.KV.HashAlgo
		if algo != "sha256" && algo != "sha256-bigram" {
			algo = "" // a vLLM algo names the rule's vLLM endpoints' hash, not SGLang's
		}
		return &hashcore.Spec{Engine: "sglang", Algo: algo, BlockSize: bs}
	case EngineTRTLLM:
		if e.BlockSize > 0 {
			return &hashcore.Spec{Engine: "kvgate", BlockSize: bs}
		}
	}
	return nil
}

// chainOf is the chain endpoint i's inventory keys are under: its engine's contract, or
// kvgate's fast chain when it holds re-hashed keys (TensorRT-LLM, failed parity, -kv-keys
// rehash), each at the endpoint's block size (ingest.Manager.Contract).
func (k *kvRouter) chainOf(i int) hashcore.Chain {
	c, f := k.mgr.Contract(i)
	if c == nil && f == nil {
		c, f = k.chain, k.fast
	}
	if c == nil || k.mgr.UsesFastKeys(i) {
		return f
	}
	return c
}

// pick sets d to the endpoint and rank of inventory slot sl.
func (k *kvRouter) pick(d *decision, sl int) {
	d.ep, d.slot, d.rank = int(k.ranks.ep[sl]), sl, k.ranks.rankOf(sl)
}

// bstr views b as a string without copying; the callee must not keep it.
func bstr(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func (k *kvRouter) miss(st *reqState, d *decision, r Route) {
	d.ep, d.slot, d.rank, d.route = -1, -1, -1, r
	st.meter.miss(r)
}

// route is the guard ladder: text_empty, model_unknown, tokenize, no_blocks,
// no_worker, shallow; then the winner's load bound (next-best overlap when over it).
// el already excludes endpoints that are excluded, admin-down, unhealthy or whose
// breaker is open. On a miss d.ep is -1 and d.route names the reason.
func (k *kvRouter) route(st *reqState, el shard.Mask, d *decision) {
	s := k.s
	b := st.body
	oa := &st.oa
	st.tokens, st.keys, st.fastKeys = st.tokens[:0], st.keys[:0], st.fastKeys[:0]
	st.trieEngine = false
	clear(st.scores)
	if st.chat {
		m := oa.Value[openai.FMessages]
		if isResponses(oa) {
			m = oa.Value[openai.FInput] // a Responses body: "input" is the conversation
		}
		if !m.Present() || m.End-m.Start <= 2 || (b[m.Start] == '[' && !openai.HasElements(m.Bytes(b))) {
			k.miss(st, d, RouteMissTextEmpty)
			return
		}
	} else if p := oa.Value[openai.FPrompt]; !p.Present() || p.End-p.Start <= 2 || oa.Prompt == openai.PromptNone {
		k.miss(st, d, RouteMissTextEmpty)
		return
	}
	// Model -> tokenizer; LoRA adapters are served under their own names.
	mv := oa.Value[openai.FModel]
	if !mv.Present() {
		k.miss(st, d, RouteMissModelUnknown)
		return
	}
	st.text = openai.AppendUnquoted(st.text[:0], mv.Bytes(b))
	name := bstr(st.text)
	ex := &st.ex // in the pooled state: a local would escape through the Chain interface
	*ex = hashcore.Extras{}
	if a, ok := k.lora[name]; ok {
		ex.LoRAName = a.name
		name = a.base
	}
	model := k.pool.Get(name)
	if model == nil {
		st.meter.unknownModel()
		k.miss(st, d, RouteMissModelUnknown)
		return
	}
	// A bound on the text kvgate tokenizes: a 1M-token prompt costs ~100 ms and ~70 MB
	// of transient memory to tokenize and hash; above the bound the request is routed
	// by the rule's selector (kv-miss:too_long) and still reaches an engine.
	var textLen int32
	if st.chat {
		m := oa.Value[openai.FMessages]
		textLen = m.End - m.Start + oa.Value[openai.FInput].End - oa.Value[openai.FInput].Start
	} else {
		p := oa.Value[openai.FPrompt]
		textLen = p.End - p.Start
	}
	if max := s.cfg.KV.MaxPromptBytes; max > 0 && int(textLen) > max {
		k.miss(st, d, RouteMissTooLong)
		return
	}
	t0 := time.Now()
	var err error
	switch {
	case st.chat: // the request fields and shapes: fields.go
		var missed bool
		if missed, err = k.tokenizeChat(st, d, model); missed {
			return
		}
	case oa.Prompt == openai.PromptString || oa.Prompt == openai.PromptStrings:
		p := oa.Value[openai.FPrompt].Bytes(b)
		if oa.Prompt == openai.PromptStrings {
			k.countBatch(st, p)
			p = openai.FirstElement(p)
		}
		st.out = openai.AppendUnquoted(st.out[:0], p)
		if len(st.out) == 0 {
			k.miss(st, d, RouteMissTextEmpty)
			return
		}
		if boolField(oa.Value[openai.FAddSpecialTokens].Bytes(b), true) {
			st.tokens, err = model.EncodePromptMemo(st.tokens, bstr(st.out), k.memo)
		} else {
			st.tokens, err = model.Tokenizer().Encode(st.tokens, bstr(st.out), false)
		}
		if err == nil && k.truncated(st, d) {
			return
		}
	default: // token ids: the engine uses them as they are
		if oa.Prompt == openai.PromptBatch {
			k.countBatch(st, oa.Value[openai.FPrompt].Bytes(b))
		}
		var ok bool
		if st.tokens, ok = openai.AppendTokens(st.tokens[:0], oa.Value[openai.FPrompt].Bytes(b)); !ok {
			err = errBadTokens
		} else if k.truncated(st, d) {
			return
		}
	}
	st.meter.stage(StageTokenize, t0)
	if err != nil {
		k.miss(st, d, RouteMissTokenize)
		return
	}
	if salt := oa.Value[openai.FCacheSalt]; salt.Present() {
		st.salt = openai.AppendUnquoted(st.salt[:0], salt.Bytes(b))
		ex.CacheSalt = bstr(st.salt)
	}
	// Split the eligible endpoints' slots by the keys their inventory holds.
	t1 := time.Now()
	engMask, fastMask := st.engMask, st.fastMask
	kc := k.keyedSlots()
	slotEl := k.ranks.expand(el, st.slotEl)
	nEng, nFast, nOther := engMask.And(kc.eng, slotEl), fastMask.And(kc.fast, slotEl), 0
	st.ngroups = 0
	for _, o := range kc.other {
		// An endpoint of another contract or block size (its option, or adopted from its
		// events): one chain per distinct contract.
		if slotEl.Has(o.slot) {
			st.group(o.chain).mask.Set(o.slot)
			nOther++
		}
	}
	var exp *hashcore.Extras
	if ex.LoRAName != "" || ex.CacheSalt != "" {
		exp = ex
	}
	if nEng > 0 {
		if k.chainMemo != nil {
			st.keys, st.memoBlocks = k.chainMemo.AppendKeysHit(st.keys[:0], st.tokens, exp)
		} else {
			st.keys = hashcore.Keys(k.chain, st.keys[:0], st.tokens, exp)
		}
	}
	if nFast > 0 {
		st.fastKeys = hashcore.Keys(k.fast, st.fastKeys[:0], st.tokens, exp)
	}
	st.trieEngine = nEng > 0 && nFast == 0 && nOther == 0 && len(st.keys) > 0
	otherKeys := 0
	for g := range st.groups[:st.ngroups] {
		grp := &st.groups[g]
		grp.keys = k.groupKeys(grp.chain, grp.keys[:0], st.tokens, exp)
		otherKeys += len(grp.keys)
	}
	st.meter.stage(StageHash, t1)
	if len(st.keys) == 0 && len(st.fastKeys) == 0 && otherKeys == 0 {
		if len(st.tokens) >= k.blockSize && nEng+nFast+nOther == 0 {
			k.miss(st, d, RouteMissNoWorker)
			return
		}
		k.miss(st, d, RouteMissNoBlocks)
		return
	}
	t2 := time.Now()
	if nEng > 0 {
		k.inv.Score(st.keys, engMask, k.mode, st.scores)
	}
	if nFast > 0 {
		k.inv.Score(st.fastKeys, fastMask, k.mode, st.scores2)
		for sl := range k.ranks.ep {
			if fastMask.Has(sl) {
				st.scores[sl] = st.scores2[sl]
			}
		}
	}
	for g := range st.groups[:st.ngroups] {
		grp := &st.groups[g]
		if len(grp.keys) == 0 {
			continue
		}
		k.inv.Score(grp.keys, grp.mask, k.mode, st.scores2)
		// In the rule's blocks, so every candidate's match is in one unit (a finer
		// page size rounds down to whole rule blocks).
		bs := grp.chain.BlockSize()
		for sl := range k.ranks.ep {
			if grp.mask.Has(sl) {
				st.scores[sl] = int32(int(st.scores2[sl]) * bs / k.blockSize)
			}
		}
	}
	st.meter.stage(StageScore, t2)
	k.choose(st, el, d)
}

// choose is the KV tier's verdict once the prompt is scored: the deepest holder must
// match enough blocks (else kv-miss:shallow, or no_worker when none holds any), then the
// rule's policy picks among the eligible endpoints. Blocks kvgate sent and the engine
// has not reported yet (the pending / prefix-trie inventory) count as held for the cost
// policy's uncached tokens; predicted cached tokens, the parity evidence, count only
// what the engines reported.
//
// Candidates are inventory slots: an endpoint's data-parallel ranks compete as the
// separate engines they are, and the winner names both.
func (k *kvRouter) choose(st *reqState, el shard.Mask, d *decision) {
	el = k.ranks.expand(el, st.slotEl)
	n := k.ranks.cands
	matched := st.matched[:n]
	copy(matched, st.scores[:n])
	var cpu, sto []int32
	if k.ranks.tiered {
		cpu, sto = st.tierCPU[:n], st.tierSto[:n]
		k.ranks.foldTiers(st.scores, matched, cpu, sto)
	}
	if k.foldTrie {
		if keys := k.trieKeys(st); len(keys) > 0 {
			// Candidate-length scratch: past it lie tier slots' scores.
			k.trie.score(keys, el, st.scores2[:n], st.scores3[:n], matched)
		}
	}
	best := -1
	for i := range matched {
		if el.Has(i) && matched[i] > 0 && (best < 0 || matched[i] > matched[best]) {
			best = i
		}
	}
	d.uncached = len(st.tokens)
	c := &st.cand
	blocks := st.keys
	if len(blocks) == 0 {
		blocks = st.fastKeys
	}
	*c = route.Candidates{Eligible: el, Matched: matched, Best: best, Tokens: len(st.tokens),
		BlockSize: k.blockSize, MinBlocks: max(k.minBlocks, 1), Blocks: blocks,
		CPU: cpu, Storage: sto, CPUCost: k.s.cfg.KV.TierWeightCPU, StorageCost: k.s.cfg.KV.TierWeightStorage}
	defer st.meter.prompt(blocks)
	if best < 0 || matched[best] < k.minBlocks {
		r := RouteMissNoWorker
		if best >= 0 {
			r = RouteMissShallow
		}
		k.miss(st, d, r)
		if k.loadOnMiss {
			// No endpoint holds enough of the prompt: it prefills in full wherever it
			// goes, so the least predicted first token is the least queued work.
			if sl := k.sel.Select(c, st.obs); sl >= 0 {
				k.pick(d, sl)
			}
		}
		return
	}
	winner := k.sel.Select(c, st.obs)
	if winner < 0 {
		k.miss(st, d, RouteMissNoWorker)
		return
	}
	if winner != best {
		st.meter.nextBest()
	}
	k.pick(d, winner)
	d.predicted = int(st.scores[winner]) * k.blockSize
	d.uncached = c.Uncached(winner)
	switch {
	case k.ranks.reported(st.scores, winner) >= c.MinBlocks:
		d.route = RouteKVHit
		st.meter.hit(d.ep)
	case matched[winner] >= c.MinBlocks:
		d.route = RoutePrefixTrie
	default:
		d.route = RouteKVSpread
	}
}

// sendsNewBlocks reports whether the engine d sends st to should publish stored blocks
// for it: the prompt has full blocks beyond the longest prefix the engine has reported
// holding, on any tier of the rank d names or, with no rank named (the engine's own
// balancer picks), of any of its ranks. The stale check counts only these requests
// (epState.sentNew). The engines' reports alone count, not kvgate's pending entries:
// blocks kvgate only expects an engine to hold are exactly what its events confirm.
func (k *kvRouter) sendsNewBlocks(st *reqState, d *decision) bool {
	n := int32(len(st.keys))
	if n == 0 {
		n = int32(len(st.fastKeys))
	}
	if n == 0 {
		return false
	}
	l := k.ranks
	if d.slot >= 0 {
		return l.reported(st.scores, d.slot) < n
	}
	for r := 0; r < int(l.dp[d.ep]); r++ {
		if l.reported(st.scores, l.slot(d.ep, r)) >= n {
			return false
		}
	}
	return true
}

var errBadTokens = fmt.Errorf("prompt token ids must be integers in [0, 2^32)")
