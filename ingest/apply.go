package ingest

import (
	"bytes"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
)

// applier applies one rank's decoded batches to its endpoint: inventory updates, the
// block map, and parity attestation. One per rank; its buffers are reused, so a batch
// allocates nothing in steady state.
type applier struct {
	e     *endpoint
	r     *rankState // the rank whose stream this applier follows
	dec   BatchDecoder
	ev    Event
	ckeys []uint64 // scratch: the rule's key of one block
	fone  []uint64 // scratch: kvgate's fast key of one block
	fkeys []uint64 // kvgate's fast keys of the current event
	rm    []uint64
	plain []uint32 // scratch: a bigram event's plain tokens
	lora  string
	salt  string
	ex    hashcore.Extras
	// Scratch of storedSingles and removed: the keys kept as singles, those with a
	// holder-count entry, those the inventory held already.
	single, counted, held []uint64
}

func newApplier(e *endpoint, r *rankState) *applier {
	a := &applier{e: e, r: r}
	a.dec.Engine = e.cfg.Engine
	return a
}

// apply decodes and applies one batch payload. It returns the decoding error, if any;
// events decoded before the error stay applied.
func (a *applier) apply(payload []byte) error {
	e := a.e
	// Counted once applied, so a reader that sees the count sees the batch's effects.
	defer e.c.batches.Inc()
	if err := a.dec.Reset(payload); err != nil {
		e.lostMessage(err)
		return err
	}
	e.mu.Lock()
	ev := &a.ev
	for a.dec.Next(ev) {
		switch ev.Kind {
		case EventStored:
			a.stored(ev)
		case EventRemoved:
			a.removed(ev)
		case EventCleared:
			e.c.cleared.Inc()
			e.c.clearedByEngine.Inc()
			e.clearLocked(a.r)
		case EventInvalid:
			e.badEvent(ev.Bad)
		default:
			e.c.unknown.Inc()
		}
	}
	_, err := a.dec.Finish()
	e.mu.Unlock()
	if err != nil {
		e.lostMessage(err)
	}
	return err
}

// lostMessage counts one event message that does not decode, whole or past some events
// (what it held past them is lost), and WARNs at most once per badEventWarnEvery with the
// number since the last WARN: an engine whose messages kvgate cannot read (another wire
// format, a version kvgate does not know) leaves the inventory behind without a word
// otherwise. Any of the endpoint's goroutines (ranks, replays, the drain) may call it.
func (e *endpoint) lostMessage(err error) {
	e.c.decodeErrors.Inc()
	now, last := time.Now().UnixNano(), e.lostWarned.Load()
	if now-last < int64(badEventWarnEvery) || !e.lostWarned.CompareAndSwap(last, now) {
		return
	}
	total := e.c.decodeErrors.Get()
	e.m.cfg.Logger.Warn("ingest: an event message is unreadable; the events in it are lost",
		"endpoint", e.cfg.Name, "err", err, "unreadable_since_last_warn", total-e.lostAt.Swap(total))
}

// badEventWarnEvery spaces the WARNs about undecodable events of one endpoint.
const badEventWarnEvery = 10 * time.Second

// badEvent counts one event skipped as undecodable and WARNs at most once per
// badEventWarnEvery, with the number skipped since the last WARN.
func (e *endpoint) badEvent(reason BadReason) {
	e.c.badEvents[reason].Inc()
	e.badSince++
	now := time.Now()
	if now.Sub(e.badWarned) < badEventWarnEvery {
		return
	}
	e.m.cfg.Logger.Warn("ingest: skipped an event that does not decode; the rest of its batch is applied",
		"endpoint", e.cfg.Name, "reason", reason.String(), "skipped_since_last_warn", e.badSince)
	e.badWarned, e.badSince = now, 0
}

// clearLocked empties rank r's inventory slot, block map and holder counts (e.mu held):
// its engine restarted or cleared its cache; the other ranks keep theirs. The tier
// counts (distinct hashes per tier, summed over ranks) are recounted from the ranks left.
func (e *endpoint) clearLocked(r *rankState) {
	var buf [numMedia + 1]int
	for _, s := range r.slots(buf[:0]) {
		e.m.cfg.Inventory.ClearEndpoint(s)
	}
	r.blocks.reset()
	r.refs.reset()
	r.singles = 0
	var n [numMedia]int64
	for _, o := range e.rk {
		if o != r {
			o.refs.countTiers(&n)
			n[singleTier] += o.singles
		}
	}
	for i := range e.tiers {
		e.tiers[i].Store(n[i])
	}
}

func (e *endpoint) clear(r *rankState) {
	e.mu.Lock()
	e.clearLocked(r)
	e.mu.Unlock()
}

func (a *applier) extras(ev *Event) *hashcore.Extras {
	if len(ev.LoRAName) == 0 && len(ev.CacheSalt) == 0 {
		return nil
	}
	// Each allocates only when the adapter (salt) changes from the previous event's.
	if string(ev.LoRAName) != a.lora {
		a.lora = string(ev.LoRAName)
	}
	if string(ev.CacheSalt) != a.salt {
		a.salt = string(ev.CacheSalt)
	}
	a.ex = hashcore.Extras{LoRAName: a.lora, CacheSalt: a.salt}
	return &a.ex
}

// unpair turns a bigram event's flattened pairs [t0,t1, t1,t2, ...] back into the plain
// tokens t0, t1, t2, ... (one more than pairs), in a.plain; false when consecutive pairs
// do not overlap (not one token sequence).
func (a *applier) unpair(words []uint32) ([]uint32, bool) {
	p := a.plain[:0]
	for i := 0; i+1 < len(words); i += 2 {
		if i > 0 && words[i] != words[i-1] {
			return nil, false
		}
		p = append(p, words[i])
	}
	if len(words) > 0 {
		p = append(p, words[len(words)-1])
	}
	a.plain = p
	return p, true
}

// extrasReproducible reports whether an event's extra_keys are ones kvgate re-hashes: none,
// or the LoRA name alone on each block. Multimodal items, cache salts and prompt
// embeddings are not in the event in a form kvgate can check.
func extrasReproducible(ev *Event) bool {
	if ev.ExtraKeys == nil {
		return true
	}
	var r reader
	r.reset(ev.ExtraKeys)
	if r.isNil() {
		return true
	}
	for n := r.arrayLen(); n > 0 && r.err == nil; n-- {
		if r.isNil() {
			continue
		}
		if r.arrayLen() != 1 || string(r.str()) != string(ev.LoRAName) {
			return false
		}
	}
	return r.err == nil
}

func (a *applier) stored(ev *Event) {
	e := a.e
	cfg := &e.m.cfg
	r := a.r
	e.c.stored.Inc()
	nb := len(ev.Hashes)
	slot := r.tierSlot[ev.Medium]
	routed := slot == r.slot
	fastKeys := false
	if slot >= 0 && nb > 0 && (e.ct.Load().chain != nil || e.keys != KeysEngine) {
		// Before the holders: a parity mismatch here switches the endpoint to fast keys,
		// and the key mode decides how a hash held once is kept.
		fastKeys = a.hashBlocks(ev, routed)
	}
	if ev.Medium != singleTier {
		a.endSingles(r)
	}
	var fresh [numMedia]int64 // the tier counts' changes, added once per event
	if r.keepsSingles(ev.Medium) {
		a.storedSingles(ev, slot, &fresh)
		e.addTiers(&fresh)
		return
	}
	r.refs.touch(ev.Hashes)
	for _, h := range ev.Hashes {
		e.hold(r, h, ev.Medium, &fresh)
	}
	e.addTiers(&fresh)
	if slot < 0 || nb == 0 {
		return
	}
	var added int
	if e.fast.Load() {
		// An offload store names blocks the GPU stored before, often without tokens:
		// their fast keys are in the block map.
		if !fastKeys && (routed || !a.knownFastKeys(ev.Hashes)) {
			e.c.unkeyable.Inc()
			return
		}
		added = cfg.Inventory.Add(slot, a.fkeys)
	} else {
		added = cfg.Inventory.Add(slot, ev.Hashes)
	}
	e.c.keysAdded.Add(added)
}

// storedSingles applies a store of engine keys on rank r's GPU tier, whose lone holders
// r keeps as singles: a hash with a refs entry counts one more holder there; any other
// is a single unless the inventory already held it (a single's second holder: it gets
// an entry of two). Nearly every store of a churning cache is a new single, which costs
// no refs lookup at all while r's table is empty.
func (a *applier) storedSingles(ev *Event, slot int, fresh *[numMedia]int64) {
	e, r := a.e, a.r
	inv := e.m.cfg.Inventory.(heldInventory)
	single := ev.Hashes
	added := 0
	if r.refs.live > 0 {
		r.refs.touch(ev.Hashes)
		a.single, a.counted = a.single[:0], a.counted[:0]
		for _, h := range ev.Hashes {
			if r.refs.find(h) != nil {
				e.hold(r, h, ev.Medium, fresh)
				a.counted = append(a.counted, h)
			} else {
				a.single = append(a.single, h)
			}
		}
		if len(a.counted) > 0 {
			added = inv.Add(slot, a.counted)
		}
		single = a.single
	}
	if len(single) > 0 {
		n, held := inv.AddHeld(slot, single, a.held[:0])
		a.held = held
		added += n
		r.singles += int64(n)
		fresh[singleTier] += int64(n)
		for _, h := range held {
			e.holdAgain(r, h, fresh)
		}
	}
	e.c.keysAdded.Add(added)
}

// holdAgain counts a second holder of h on r's single tier, which the inventory held
// already (e.mu held): a single gets a refs entry of two, a hash that got its entry
// earlier in the same event one more.
func (e *endpoint) holdAgain(r *rankState, h uint64, fresh *[numMedia]int64) {
	if r.refs.find(h) == nil {
		r.singles--
		e.hold(r, h, singleTier, fresh)
		fresh[singleTier]-- // it was on the tier already, as a single
	}
	e.hold(r, h, singleTier, fresh)
}

// addTiers adds an event's changes to the tier counts.
func (e *endpoint) addTiers(fresh *[numMedia]int64) {
	for t := range fresh {
		if fresh[t] != 0 {
			e.tiers[t].Add(fresh[t])
		}
	}
}

// hold counts one more holder of engine hash h on tier m of rank r (e.mu held), and
// the change to each tier's count of distinct hashes in d. A full table drops another
// hash's entry: that hash leaves the tier counts, but one held on r's single tier stays
// there as a single (one holder, which it has at least).
func (e *endpoint) hold(r *rankState, h uint64, m Medium, d *[numMedia]int64) {
	fresh, dropped := r.refs.inc(h, m)
	if fresh {
		d[m]++
	}
	if dropped != 0 {
		e.c.refEvictions.Inc()
		if dropped.Has(singleTier) && r.singlesOn {
			dropped &^= 1 << singleTier
			r.singles++
		}
		for t := Medium(0); t < numMedia; t++ {
			if dropped.Has(t) {
				d[t]--
			}
		}
	}
}

// knownFastKeys puts the block map's fast key of every hash in a.fkeys; false when one
// is missing.
func (a *applier) knownFastKeys(hashes []uint64) bool {
	a.fkeys = a.fkeys[:0]
	for _, h := range hashes {
		b := a.r.blocks.get(h)
		if b == nil || !b.hasF {
			return false
		}
		a.fkeys = append(a.fkeys, b.fkey)
	}
	return true
}

// hashBlocks re-hashes an event's token_ids: with the rule's contract to attest parity,
// and with kvgate's fast chain into a.fkeys. It records every block in the block map
// (routed: as held on a routed tier) and reports whether a.fkeys holds a fast key for
// every block.
func (a *applier) hashBlocks(ev *Event, routed bool) bool {
	e := a.e
	ct := e.ct.Load()
	nb, bs := len(ev.Hashes), ev.BlockSize
	a.fkeys = a.fkeys[:0]
	tokens := ev.Tokens
	extra := 0 // tokens a block needs past its end: the next token of a bigram page
	if ev.Bigram {
		var ok bool
		if tokens, ok = a.unpair(ev.Tokens); !ok {
			tokens = nil
		}
		extra = 1
	}
	if bs <= 0 || len(tokens) != nb*bs+extra || isCheckpoint(ev) {
		// Offload events may carry no tokens: nothing to hash. A mamba checkpoint store
		// names a node's last page hash with only that page's tokens and no parent.
		if ct.chain != nil {
			e.c.paritySkipped.Inc()
		}
		return false
	}
	// Blocks the endpoint's block size cannot key (SGLang's page 1 under a rule of 16):
	// adopt the engine's size, unless the endpoint pins its own.
	if bs%ct.blockSize() != 0 && e.adoptLocked(bs) {
		ct = e.ct.Load()
	}
	e.noteBlockSize(bs, ct.blockSize())
	var pc, pf hashcore.Digest
	hasC, hasF := true, true
	first := !ev.HasParent
	if ev.HasParent {
		p := a.r.blocks.get(ev.Parent)
		if p == nil {
			e.c.orphans.Inc()
			hasC, hasF = false, false
		} else {
			pc, hasC, pf, hasF = p.cd, p.hasC, p.fd, p.hasF
		}
	} else {
		if ct.chain != nil {
			pc = ct.chain.Root()
		}
		pf = ct.fast.Root()
	}
	attest := ct.chain != nil && hasC && extrasReproducible(ev)
	// The rule's contract must hash the same kind of page the engine published. A block
	// k times the rule's (a hybrid model's group with larger blocks) is k of the rule's
	// blocks: the engine publishes the key of the last (vLLM's BlockHashListWithBlockSize).
	cause := causeNone
	switch {
	case !attest:
	case bs%ct.chain.BlockSize() != 0:
		cause = causeBlockSize
	case hashcore.HashesBigrams(ct.chain) != ev.Bigram:
		cause = causeBigram
	}
	if cause != causeNone {
		attest = false
	}
	// Engine mode never switches: fast keys would be wasted work.
	doFast := hasF && bs%ct.fast.BlockSize() == 0 && e.keys != KeysEngine
	ex := a.extras(ev)
	mismatch := false
	for i := 0; i < nb; i++ {
		ent := a.r.blocks.put(ev.Hashes[i])
		switch {
		case routed:
			ent.level = 0 // on a routed tier again (see removed)
		case !ent.hasC && !ent.hasF:
			ent.level = 1 // new, and only off the routed tiers: a re-hash switch skips it
		}
		if attest {
			a.ckeys, pc = ct.chain.AppendKeys(a.ckeys[:0], pc, tokens[i*bs:(i+1)*bs+extra], ex, first && i == 0)
			if n := len(a.ckeys); n != bs/ct.chain.BlockSize() || a.ckeys[n-1] != ev.Hashes[i] {
				mismatch = true
			}
			ent.cd, ent.hasC = pc, true
		}
		if doFast {
			a.fone, pf = ct.fast.AppendKeys(a.fone[:0], pf, tokens[i*bs:(i+1)*bs], ex, first && i == 0)
			if n := len(a.fone); n == bs/ct.fast.BlockSize() {
				ent.fkey, ent.fd, ent.hasF = a.fone[n-1], pf, true
				a.fkeys = append(a.fkeys, a.fone[n-1])
			}
		}
	}
	if mismatch && cause == causeNone && bs != ct.blockSize() && a.reproducesAt(ev, bs) && e.adoptLocked(bs) {
		// The engine hashes whole bs-token blocks (vLLM --block-size 32 under a rule of
		// 16), not k of the rule's: under its own size the same blocks attest.
		return a.hashBlocks(ev, routed)
	}
	switch {
	case cause != causeNone || mismatch:
		a.mismatch(ev, cause)
	case attest:
		e.c.parityOK.Inc()
		e.parity.CompareAndSwap(parityUnknown, parityOK)
	case ct.chain != nil:
		e.c.paritySkipped.Inc()
	}
	return doFast && len(a.fkeys) == nb
}

// isCheckpoint reports an SGLang mamba component store: one hash, the last page of a
// radix node, published without its parent (mem_cache events recorder), so its tokens
// cannot be re-hashed; its hash is the full-attention page's, counted as another holder.
func isCheckpoint(ev *Event) bool {
	c := ev.Component
	for i := 0; i+5 <= len(c); i++ {
		if bytes.EqualFold(c[i:i+5], []byte("mamba")) {
			return true
		}
	}
	return false
}

// noteBlockSize records the block size a store's tokens prove (bs tokens per published
// key) and, the first time it is one the rule cannot key (not a multiple of ruleBS),
// WARNs naming both: that endpoint's blocks get no keys of the rule's (e.mu held).
func (e *endpoint) noteBlockSize(bs, ruleBS int) {
	if cur := e.engineBS.Load(); cur == 0 || int64(bs) < cur {
		e.engineBS.Store(int64(bs))
	}
	if bs%ruleBS == 0 || e.sizeWarned == bs {
		return
	}
	e.sizeWarned = bs
	e.sizeMismatch.Store(true)
	e.m.cfg.Logger.Warn("ingest: the engine's blocks do not fit the rule's block size; kvgate cannot key them",
		"endpoint", e.cfg.Name, "engine", e.cfg.Engine, "engine_block_size", bs, "rule_block_size", ruleBS,
		"fix", "set the rule's block size to the engine's (vLLM --block-size, SGLang --page-size, TensorRT-LLM tokens_per_block)")
}

// A parity failure's cause when the event alone shows it, before any key is compared.
const (
	causeNone      = iota
	causeBlockSize // the engine's blocks are not the rule's size
	causeBigram    // the engine keys bigram pages (EAGLE) and the rule plain ones, or back
)

// mismatch records a parity failure; the first one is diagnosed and logged, and in auto
// mode switches the endpoint to kvgate's re-hashed keys.
func (a *applier) mismatch(ev *Event, known int) {
	e := a.e
	e.c.parityMismatch.Inc()
	if e.parity.Swap(parityMismatch) == parityMismatch {
		return
	}
	ct := e.ct.Load()
	cause := a.diagnose(ev, known)
	e.cause.Store(&cause)
	switched := e.keys == KeysAuto && !e.fast.Load()
	e.m.cfg.Logger.Warn("ingest: engine keys differ from the rule's contract",
		"endpoint", e.cfg.Name, "contract", ct.chain.Name(), "likely_cause", cause,
		"switch_to_rehash", switched)
	if switched {
		a.switchToFastLocked()
	}
}

// switchToFastLocked replaces the endpoint's engine keys with the fast keys of every
// block in the block map, on every rank: the key mode is the endpoint's (e.mu held).
func (a *applier) switchToFastLocked() {
	e := a.e
	inv := e.m.cfg.Inventory
	e.fast.Store(true)
	e.m.keysChanged()
	for _, r := range e.rk {
		a.endSingles(r)
	}
	e.c.modeSwitches.Inc()
	buf := a.rm[:0]
	for _, r := range e.rk {
		var sb [numMedia + 1]int
		for _, s := range r.slots(sb[:0]) {
			inv.ClearEndpoint(s)
		}
		a.refillTiersLocked(r)
		for i := range r.blocks.ents {
			b := &r.blocks.ents[i]
			if b.used && b.hasF && b.level == 0 {
				buf = append(buf, b.fkey)
				if len(buf) == 256 {
					e.c.keysAdded.Add(inv.Add(r.slot, buf))
					buf = buf[:0]
				}
			}
		}
		if len(buf) > 0 {
			e.c.keysAdded.Add(inv.Add(r.slot, buf))
			buf = buf[:0]
		}
	}
	a.rm = buf[:0]
}

// endSingles stops r keeping singles (e.mu held) and gives each of them a holder-count
// entry, from the engine keys r's slot holds without one: before a switch to fast keys
// clears the slot that was their only record, and at r's first event on another tier
// (an offloading engine: a hash may then have holders on several tiers, and those must
// all be in one entry). (Paging the slot while other endpoints' writes rebuild a shard
// may miss a key: that hash then has no entry, and its removal is applied as a lone
// holder's, as any unknown hash's.)
func (a *applier) endSingles(r *rankState) {
	if !r.singlesOn {
		return
	}
	r.singlesOn = false
	if r.singles == 0 {
		return
	}
	e := a.e
	inv := e.m.cfg.Inventory.(heldInventory)
	var fresh [numMedia]int64
	keys, cur := a.held[:0], uint64(0)
	for {
		keys, cur = inv.Keys(r.slot, cur, 4096, keys[:0])
		for _, k := range keys {
			if r.refs.find(k) == nil {
				e.hold(r, k, singleTier, &fresh)
				fresh[singleTier]-- // on the tier already, as a single
			}
		}
		if cur == 0 {
			break
		}
	}
	a.held = keys[:0]
	r.singles = 0
	e.addTiers(&fresh)
}

// reproducesAt reports whether the endpoint's contract at block size bs reproduces a
// root store's first key: the engine hashes bs-token blocks.
func (a *applier) reproducesAt(ev *Event, bs int) bool {
	ct := a.e.ct.Load()
	if ct.spec == nil || ev.HasParent || ev.Bigram || len(ev.Tokens) < bs || len(ev.Hashes) == 0 {
		return false
	}
	s := *ct.spec
	s.BlockSize = bs
	c, err := a.e.m.chainFor(s)
	if err != nil {
		return false
	}
	k := hashcore.Keys(c, nil, ev.Tokens[:bs], a.extras(ev))
	return len(k) == 1 && k[0] == ev.Hashes[0]
}

// refillTiersLocked indexes, in r's CPU and storage slots, the fast key of every block
// the holder counts place on those tiers (a switch to re-hashed keys; e.mu held).
func (a *applier) refillTiersLocked(r *rankState) {
	inv := a.e.m.cfg.Inventory
	var one [1]uint64
	for i := range r.refs.ents {
		ent := &r.refs.ents[i]
		if ent.counts == 0 {
			continue
		}
		b := r.blocks.get(ent.key)
		if b == nil || !b.hasF {
			continue
		}
		for m := Medium(0); m < numMedia; m++ {
			if s := r.tierSlot[m]; s >= 0 && s != r.slot && ent.count(m) != 0 {
				one[0] = b.fkey
				a.e.c.keysAdded.Add(inv.Add(s, one[:]))
			}
		}
	}
}

// diagnose names the likely cause of a mismatch: block size, else (on a root block, with
// the rule's Spec) the algo that does reproduce the engine's key, else the seed.
func (a *applier) diagnose(ev *Event, known int) string {
	cfg := a.e.ct.Load()
	switch known {
	case causeBlockSize:
		return fmt.Sprintf("block size: the engine publishes %d-token blocks, the rule hashes %d", ev.BlockSize, cfg.chain.BlockSize())
	case causeBigram:
		if ev.Bigram {
			return "bigram: the engine keys EAGLE bigram pages; the rule's contract needs Bigram (SGLang with speculative decoding)"
		}
		return "bigram: the rule hashes EAGLE bigram pages but the engine publishes plain pages"
	}
	if a.e.cfg.Engine == engine.SGLang {
		return "SGLang page keys differ: check --page-size and the tokenizer/chat template"
	}
	if cfg.spec == nil || ev.HasParent {
		return "keys differ: check the engine's --prefix-caching-hash-algo, PYTHONHASHSEED, block size, LoRA and tokenizer"
	}
	bs := ev.BlockSize
	blk := ev.Tokens[:bs]
	ex := a.extras(ev)
	// A block of k rule blocks carries the key of its last (see hashBlocks).
	reproduces := func(k []uint64) bool { return len(k) > 0 && k[len(k)-1] == ev.Hashes[0] }
	if rbs := cfg.chain.BlockSize(); bs != rbs {
		// A multiple of the rule's block size passes as a hybrid group's larger blocks;
		// if the rule's contract at the engine's block size reproduces the key, the engine
		// simply hashes bigger blocks.
		s := *cfg.spec
		s.BlockSize = bs
		if c, err := hashcore.New(s); err == nil && reproduces(hashcore.Keys(c, nil, blk, ex)) {
			return fmt.Sprintf("block size: the engine hashes %d-token blocks, the rule %d (set the rule's block size to %d)", bs, rbs, bs)
		}
	}
	for _, algo := range []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} {
		s := *cfg.spec
		s.Algo = algo
		c, err := hashcore.New(s)
		if err != nil {
			continue
		}
		if reproduces(hashcore.Keys(c, nil, blk, ex)) {
			if algo == cfg.spec.Algo || (cfg.spec.Algo == "" && algo == "sha256") {
				return "extras: the contract matches on a plain block; check LoRA names and cache salts"
			}
			return fmt.Sprintf("algo: the engine hashes with %s, the rule with %s", algo, cfg.chain.Name())
		}
	}
	if ex != nil {
		s := *cfg.spec
		if c, err := hashcore.New(s); err == nil {
			if reproduces(hashcore.Keys(c, nil, blk, nil)) {
				return "LoRA: the engine's keys carry no LoRA name"
			}
		}
	}
	return "seed: no algo reproduces the engine's root block with the rule's seed; the engine's PYTHONHASHSEED differs (or it is an older vLLM with a random NONE_HASH: no parity possible)"
}

// removed applies a BlockRemoved: a hash leaves the inventory only when no routed tier
// holds it any more (another KV cache group, a duplicate block or another chunk may),
// and leaves the block map when no tier does.
func (a *applier) removed(ev *Event) {
	e := a.e
	cfg := &e.m.cfg
	e.c.removed.Inc()
	fast := e.fast.Load()
	a.rm, a.single = a.rm[:0], a.single[:0]
	r := a.r
	slot := r.tierSlot[ev.Medium]
	if ev.Medium != singleTier {
		a.endSingles(r)
	}
	singles := r.keepsSingles(ev.Medium)
	r.refs.touch(ev.Hashes)
	var tierGone int64 // hashes gone from the tier, taken off its count once per event
	for _, h := range ev.Hashes {
		known, gone, left := r.refs.dec(h, ev.Medium)
		if !known && singles {
			// No entry: a single (held once, here) or never stored. The inventory tells
			// which: whatever it removes was a single, counted off below.
			a.single = append(a.single, h)
			r.blocks.del(h)
			continue
		}
		if known && gone {
			tierGone++
		}
		if singles && left == 1<<singleTier && r.refs.dropSingle(h, singleTier) {
			r.singles++ // one holder left, on this tier: a single again
		}
		if !gone || slot < 0 || r.holdsIn(left, slot) {
			// Still held on a tier indexed in the same slot, or never indexed.
			if left == 0 {
				r.blocks.del(h)
			}
			continue
		}
		b := r.blocks.get(h)
		if !fast {
			a.rm = append(a.rm, h)
		} else if b != nil && b.hasF {
			a.rm = append(a.rm, b.fkey)
		}
		switch {
		case left == 0:
			r.blocks.del(h)
		case b != nil && slot == r.slot:
			// Kept for its other tiers' sake (a later chain may name it as parent), but
			// off the routed ones: a switch to re-hashed keys must not index it.
			b.level = 1
		}
	}
	if len(a.rm) > 0 {
		e.c.keysRemoved.Add(cfg.Inventory.Remove(slot, a.rm))
	}
	if len(a.single) > 0 {
		n := cfg.Inventory.Remove(slot, a.single)
		r.singles -= int64(n)
		tierGone += int64(n)
		e.c.keysRemoved.Add(n)
	}
	if tierGone != 0 {
		e.tiers[ev.Medium].Add(-tierGone)
	}
}
