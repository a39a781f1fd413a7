package proxy

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/ingest"
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
	memo      *tokenize.Memo      // -tokenize-memo-bytes > 0
	chainMemo *hashcore.ChainMemo // -kv-chain-memo-bytes > 0 and an engine contract
	// loadOnMiss: mode 3 with the cost policy and -select rr places a keyed prompt no
	// endpoint holds by the cost policy too (route kv-miss:<reason> all the same); rr
	// knows nothing of queues. -select chwbl keeps its content affinity for misses.
	loadOnMiss bool
	// foldTrie: the cost policy counts what kvgate sent (prefix trie, pending entries) as
	// held when it predicts uncached tokens.
	foldTrie bool
}

type loraAdapter struct{ name, base string }

func newKVRouter(s *Server, pool *tokenize.Pool) (*kvRouter, error) {
	cfg := &s.cfg
	k := &kvRouter{s: s, pool: tokenize.NewPool(), blockSize: cfg.KVBlockSize, mode: shard.Overlap,
		minBlocks: int32((cfg.KVMinMatchTokens + cfg.KVBlockSize - 1) / cfg.KVBlockSize),
		lora:      map[string]loraAdapter{}}
	if cfg.KVScorePrefix {
		k.mode = shard.Prefix
	}
	if pool != nil {
		k.pool = pool
	}
	for _, t := range cfg.Tokenizers {
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
	if cfg.TokenizeMemoBytes > 0 {
		m, err := tokenize.NewMemo(cfg.TokenizeMemoBytes)
		if err != nil {
			return nil, refuse("-tokenize-memo-bytes", "%v", err)
		}
		k.memo = m
		for _, t := range cfg.Tokenizers {
			if mdl := k.pool.Get(t.Model); mdl != nil {
				if why := mdl.Tokenizer().MemoUnsupported(); why != "" {
					s.log.Info("tokenize memo off for this model", "model", t.Model, "why", why)
				}
			}
		}
	}
	for a, base := range cfg.LoRA {
		k.lora[a] = loraAdapter{name: a, base: base}
	}
	inv, err := shard.New(shard.Config{Endpoints: len(cfg.Endpoints), MaxKeysPerEndpoint: cfg.KVMaxKeysPerEndpoint})
	if err != nil {
		return nil, fmt.Errorf("proxy: inventory: %w", err)
	}
	k.inv = inv
	switch {
	case cfg.KVMode == KVDisaggregated && cfg.PDPrefixTrieKeys > 0:
		k.trie, err = newPrefixTrie(len(cfg.Endpoints), cfg.PDPrefixTrieKeys, 0)
	case cfg.KVMode == KVConverged && cfg.KVPendingTTL > 0 && cfg.KVPolicy == "cost":
		k.trie, err = newPrefixTrie(len(cfg.Endpoints), cfg.PDPrefixTrieKeys, cfg.KVPendingTTL)
	}
	if err != nil {
		return nil, fmt.Errorf("proxy: prefix trie: %w", err)
	}
	if cfg.KVPolicy == "overlap" {
		k.sel = &route.Overlap{Loads: s.loads, LoadFactor: cfg.LoadFactor}
	} else {
		k.sel = &route.Cost{Loads: s.loads, Queues: s.queues}
		k.loadOnMiss = cfg.KVMode == KVConverged && cfg.Select == SelectRR
		k.foldTrie = k.trie != nil
	}
	k.fast = hashcore.NewFast(cfg.KVBlockSize)
	var spec *hashcore.Spec
	for _, e := range cfg.Endpoints {
		switch e.Engine {
		case EngineVLLM:
			spec = &hashcore.Spec{Engine: "vllm", Algo: cfg.KVHashAlgo, BlockSize: cfg.KVBlockSize,
				Seed: cfg.KVHashSeed, SeedSet: cfg.KVHashSeedSet}
		case EngineSGLang:
			spec = &hashcore.Spec{Engine: "sglang", Algo: cfg.KVHashAlgo, BlockSize: cfg.KVBlockSize}
		default:
			continue
		}
		break
	}
	if spec != nil {
		c, err := hashcore.New(*spec)
		if err != nil {
			flag := "-kv-hash-algo"
			if strings.Contains(err.Error(), "PYTHONHASHSEED") || strings.Contains(err.Error(), "seed") {
				flag = "-kv-hash-seed"
			} else if strings.Contains(err.Error(), "block size") {
				flag = "-kv-block-size"
			}
			return nil, refuse(flag, "%v", err)
		}
		k.chain = c
		if cfg.KVChainMemoBytes > 0 {
			if k.chainMemo, err = hashcore.NewChainMemo(c, cfg.KVChainMemoBytes); err != nil {
				return nil, refuse("-kv-chain-memo-bytes", "%v", err)
			}
		}
	}
	keys, err := ingest.ParseKeyMode(cfg.KVKeys)
	if err != nil {
		return nil, refuse("-kv-keys", "%v", err)
	}
	eps := make([]ingest.EndpointConfig, len(cfg.Endpoints))
	for i, e := range cfg.Endpoints {
		eps[i] = ingest.EndpointConfig{Name: e.Name, Index: i, Engine: e.Engine.String(),
			Events: e.Events, Replay: e.Replay, DP: e.DP, Topic: e.Topic, URL: e.URL}
	}
	mgr, err := k.newEventSource(ingest.Config{Inventory: inv, Chain: k.chain, Spec: spec, Fast: k.fast,
		Keys: keys, Logger: s.log, Metrics: s.m.set}, eps)
	if err != nil {
		return nil, err
	}
	k.mgr = mgr
	return k, nil
}

func (k *kvRouter) start(ctx context.Context) error { return k.mgr.Start(ctx) }
func (k *kvRouter) close()                          { k.mgr.Close() }

func (k *kvRouter) inventory(i int) (keys int, parity string, connected bool, lastSeq int64) {
	st := k.mgr.Status(i)
	return k.inv.Count(i), st.Parity, st.Connected, st.LastSeq
}

// bstr views b as a string without copying; the callee must not keep it.
func bstr(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func (k *kvRouter) miss(st *reqState, d *decision, r Route) {
	d.ep, d.route = -1, r
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
	if max := s.cfg.KVMaxPromptBytes; max > 0 && int(textLen) > max {
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
	// Split the eligible endpoints by the keys their inventory holds.
	t1 := time.Now()
	engMask, fastMask := st.engMask, st.fastMask
	clear(engMask)
	clear(fastMask)
	nEng, nFast := 0, 0
	for i := range s.eps {
		if !el.Has(i) {
			continue
		}
		if k.chain == nil || k.mgr.UsesFastKeys(i) {
			fastMask.Set(i)
			nFast++
		} else {
			engMask.Set(i)
			nEng++
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
	st.meter.stage(StageHash, t1)
	if len(st.keys) == 0 && len(st.fastKeys) == 0 {
		if len(st.tokens) >= k.blockSize && nEng+nFast == 0 {
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
		for i := range s.eps {
			if fastMask.Has(i) {
				st.scores[i] = st.scores2[i]
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
func (k *kvRouter) choose(st *reqState, el shard.Mask, d *decision) {
	s := k.s
	matched := st.matched
	copy(matched, st.scores)
	if k.foldTrie {
		if keys := k.trieKeys(st); len(keys) > 0 {
			k.trie.score(keys, el, st.scores2, st.scores3, matched)
		}
	}
	best := -1
	for i := range s.eps {
		if el.Has(i) && matched[i] > 0 && (best < 0 || matched[i] > matched[best]) {
			best = i
		}
	}
	d.uncached = len(st.tokens)
	c := &st.cand
	*c = route.Candidates{Eligible: el, Matched: matched, Best: best, Tokens: len(st.tokens),
		BlockSize: k.blockSize, MinBlocks: max(k.minBlocks, 1)}
	if best < 0 || matched[best] < k.minBlocks {
		r := RouteMissNoWorker
		if best >= 0 {
			r = RouteMissShallow
		}
		k.miss(st, d, r)
		if k.loadOnMiss {
			// No endpoint holds enough of the prompt: it prefills in full wherever it
			// goes, so the least predicted first token is the least queued work.
			d.ep = k.sel.Select(c, st.obs)
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
	d.ep = winner
	d.predicted = int(st.scores[winner]) * k.blockSize
	if m := matched[winner]; m >= c.MinBlocks {
		d.uncached = max(len(st.tokens)-int(m)*k.blockSize, 0)
	}
	switch {
	case st.scores[winner] >= c.MinBlocks:
		d.route = RouteKVHit
		st.meter.hit(winner)
	case matched[winner] >= c.MinBlocks:
		d.route = RoutePrefixTrie
	default:
		d.route = RouteKVSpread
	}
}

var errBadTokens = fmt.Errorf("prompt token ids must be integers in [0, 2^32)")
