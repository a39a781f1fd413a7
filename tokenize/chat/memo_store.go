package chat

import "unsafe"

// Where the render memo keeps its entries. Storing must not allocate per entry (a follow-up
// turn stores its new messages and iterations every time), and the bound must hold for the
// memory actually kept, not just for what entries count. So entries, their strings and
// their values are carved from slabs, and slabs belong to a generation: the memo fills one
// generation (genBytes of slabs), then starts the next. Entries join the insertion-order
// list in generation order; evicting from the list's front empties the oldest generation
// first, and a generation without live entries is forgotten (its slabs go to the garbage
// collector once no reader holds one of its entries). An entry hit since the eviction
// hand last passed is copied forward into the current generation instead of being
// dropped (CLOCK's second chance), so a hot entry never pins an old generation. The bytes
// counted against the bound are the slabs of the generations still holding entries, plus
// the slot table.

type memoGen struct {
	limit int64 // the memo's genBytes: no slab is larger than a fraction of it
	live  int   // entries of this generation on the list
	bytes int64 // slab bytes carved for it
	b     []byte
	vals  []Value
	strs  []string
	dicts []dictVal
	lists []listVal
	ents  []memoEntry
	evs   []memoEvent
	notes []TokenNote
	marks []NoteMark
	ids   []uint32
}

const (
	genByteSlab = 16 << 10
	genSlab     = 128
)

func genCarve[T any](g *memoGen, slab *[]T, n int) []T {
	if n > cap(*slab)-len(*slab) {
		var z T
		size := int64(unsafe.Sizeof(z))
		k := max(n, min(genSlab, int(g.limit/16/size)))
		*slab = make([]T, 0, k)
		g.bytes += int64(k) * size
	}
	l := len(*slab)
	*slab = (*slab)[:l+n]
	return (*slab)[l : l+n : l+n]
}

func (g *memoGen) str(s string) string {
	if len(s) == 0 {
		return ""
	}
	if len(s) > cap(g.b)-len(g.b) {
		k := max(len(s), min(genByteSlab, int(g.limit/4)))
		g.b = make([]byte, 0, k)
		g.bytes += int64(k)
	}
	n := len(g.b)
	g.b = append(g.b, s...)
	return unsafe.String(&g.b[n], len(s))
}

// copyable: v has value semantics all the way down (no namespace, loop or callable).
func copyable(v Value) bool {
	switch v.k {
	case kUndefined, kNone, kBool, kInt, kFloat, kString:
		return true
	case kList:
		for _, it := range v.lst().items {
			if !copyable(it) {
				return false
			}
		}
		return true
	case kDict:
		for _, it := range v.dct().vals {
			if !copyable(it) {
				return false
			}
		}
		return true
	}
	return false
}

// copyValue copies a copyable v into g's slabs. The identities of bound dicts (memoH,
// memoID) go with it only when keep says so (an entry copied forward); nested ones have none.
func (g *memoGen) copyValue(v Value, keep bool) Value {
	switch v.k {
	case kString, kUndefined:
		return Value{k: v.k, s: g.str(v.s)}
	case kList:
		items := genCarve(g, &g.vals, len(v.lst().items))
		for i, it := range v.lst().items {
			items[i] = g.copyValue(it, keep)
		}
		l := &genCarve(g, &g.lists, 1)[0]
		*l = listVal{items: items, isTuple: v.lst().isTuple}
		return Value{k: kList, p: unsafe.Pointer(l)}
	case kDict:
		src := v.dct()
		d := &genCarve(g, &g.dicts, 1)[0]
		d.keys = genCarve(g, &g.strs, len(src.keys))
		d.vals = genCarve(g, &g.vals, len(src.keys))
		for i, k := range src.keys {
			d.keys[i], d.vals[i] = g.str(k), g.copyValue(src.vals[i], keep)
		}
		if len(d.keys) > 16 {
			d.index = make(map[string]int, len(d.keys))
			for i, k := range d.keys {
				d.index[k] = i
			}
			g.bytes += indexBytes(len(d.keys)) // outside the slabs, but the memo keeps it
		}
		if keep {
			d.memoH, d.memoID = src.memoH, src.memoID
		}
		return dictValue(d)
	}
	return v
}

// indexBytes estimates the heap of a dict's index of n keys: Go's map keeps its slots (a
// string key, an int value, a control byte) at most 7/8 full, in power-of-two tables.
func indexBytes(n int) int64 {
	slots := int64(8)
	for slots*7/8 < int64(n) {
		slots *= 2
	}
	return slots*28 + 128
}

// copyEntry copies src's content into a new entry of g (not yet published).
func (g *memoGen) copyEntry(src *memoEntry, keep bool) *memoEntry {
	e := &genCarve(g, &g.ents, 1)[0]
	e.hash, e.loop, e.format, e.id, e.itemID = src.hash, src.loop, src.format, src.id, src.itemID
	e.ctl, e.steps = src.ctl, src.steps
	e.raw = g.str(src.raw)
	e.out = g.str(src.out)
	e.val = g.copyValue(src.val, keep)
	if len(src.ev) > 0 {
		e.ev = genCarve(g, &g.evs, len(src.ev))
		for i, x := range src.ev {
			e.ev[i] = memoEvent{e: x.e, s: x.s, v: g.copyValue(x.v, false)}
		}
	}
	return e
}

// cur returns the generation to carve from, starting a new one when it is full (under mu).
func (m *RenderMemo) cur() *memoGen {
	g := m.gens[len(m.gens)-1]
	if g.bytes >= m.genBytes {
		if g.live == 0 {
			m.gens = m.gens[:len(m.gens)-1] // emptied while current: nothing to wait for
		}
		g = &memoGen{limit: m.genBytes}
		m.gens = append(m.gens, g)
	}
	return g
}

// storeBound stores a message's converted value (in the render's arena): it returns the
// memo's copy, or false when the memo holds it already (another render stored it) or it
// is too large to keep.
func (m *RenderMemo) storeBound(h uint64, format ContentFormat, raw []byte, v Value) (Value, bool) {
	if int64(len(raw)) > m.genBytes/4 {
		return undefined, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.set(h)
	for i := range set {
		if e := set[i].get(h); e != nil && e.loop == nil && e.format == format && e.raw == string(raw) {
			return e.val, true
		}
	}
	g := m.cur()
	e := g.copyEntry(&memoEntry{hash: h, format: format, raw: unsafe.String(unsafe.SliceData(raw), len(raw)), val: v}, false)
	// Every dict a loop may take as its item (the message; each tool) gets an identity.
	m.nextID++
	e.id = m.nextID
	if e.val.k == kDict {
		e.val.dct().memoH, e.val.dct().memoID = h, e.id
	} else {
		for i, it := range e.val.lst().items {
			if it.k == kDict {
				m.nextID++
				it.dct().memoH, it.dct().memoID = mix(h, uint64(i)+1)|1, m.nextID
			}
		}
	}
	m.publish(e, g)
	return e.val, true
}

// storeIter stores a recorded iteration (src's strings and values in the render's arena;
// an item that is a bound message is kept by its id).
func (m *RenderMemo) storeIter(src *memoEntry) {
	if int64(len(src.out)) > m.genBytes/4 {
		return
	}
	if src.val.k == kDict && src.val.dct().memoID != 0 {
		src.itemID, src.val = src.val.dct().memoID, undefined
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.cur()
	m.publish(g.copyEntry(src, false), g)
}

// publish puts e (carved from g) in its set and at the list's back, then evicts down to
// the bound (under mu).
func (m *RenderMemo) publish(e *memoEntry, g *memoGen) {
	base := m.setIndex(e.hash)
	way := -1
	for i := range memoWays {
		if m.slots[base+i].Load() == nil {
			way = i
			break
		}
	}
	if way < 0 {
		// CLOCK within the set: the first way not hit since the last pass; passing clears.
		for i := range memoWays {
			old := m.slots[base+i].Load()
			if !old.ref.Load() {
				way = i
				break
			}
			old.ref.Store(false)
		}
		if way < 0 {
			way = int(e.hash>>32) % memoWays
		}
		m.drop(m.slots[base+way].Load())
	}
	e.slot, e.gen = base+way, g
	g.live++
	m.slots[e.slot].store(e)
	m.pushBack(e)
	m.account()
	m.shrink(e)
}

// shrink evicts from the list's front down to the bound; fresh, the entry just stored or
// noted, gets no second chance (under mu).
func (m *RenderMemo) shrink(fresh *memoEntry) {
	for passes := 0; m.bytes.Load() > m.maxBytes && m.list.next != &m.list; {
		old := m.list.next
		if old != fresh && old.ref.Load() && passes < 64 {
			passes++
			// Second chance: forward into the current generation, so it pins no old one.
			ng := m.cur()
			c := ng.copyEntry(old, true)
			if n := old.note.Load(); n != nil {
				c.note.Store(ng.copyNote(n))
			}
			c.slot, c.gen = old.slot, ng
			ng.live++
			m.slots[c.slot].store(c)
			m.unlink(old)
			m.release(old.gen)
			m.pushBack(c)
			m.account()
			continue
		}
		m.drop(old)
	}
}

func (m *RenderMemo) pushBack(e *memoEntry) {
	e.prev, e.next = m.list.prev, &m.list
	e.prev.next, m.list.prev = e, e
}

// drop evicts old (under mu).
func (m *RenderMemo) drop(old *memoEntry) {
	m.unlink(old)
	m.slots[old.slot].e.CompareAndSwap(old, nil)
	m.evictions.Add(1)
	m.release(old.gen)
	m.account()
}

func (m *RenderMemo) unlink(e *memoEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// release notes that an entry of g left the list; an old generation left empty is
// forgotten.
func (m *RenderMemo) release(g *memoGen) {
	g.live--
	if g.live > 0 || g == m.gens[len(m.gens)-1] {
		return
	}
	for i, x := range m.gens {
		if x == g {
			copy(m.gens[i:], m.gens[i+1:])
			m.gens[len(m.gens)-1] = nil
			m.gens = m.gens[:len(m.gens)-1]
			return
		}
	}
}

// account sets bytes to the slab bytes of the generations kept plus the slot table.
func (m *RenderMemo) account() {
	n := int64(len(m.slots)) * memoSlotBytes
	for _, g := range m.gens {
		n += g.bytes
	}
	m.bytes.Store(n)
}
