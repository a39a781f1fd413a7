package chat

import "unsafe"

// arena hands out the per-render objects (dicts, lists, key and value slices, loop state) from
// slabs the pooled renderer keeps between renders, so a steady stream of requests allocates
// little. Nothing built from an arena outlives the Render call that built it: the output is
// copied bytes, and reset clears the slabs before reuse.
type arena struct {
	strs  []string
	vals  []Value
	dicts []dictVal
	lists []listVal
	loops []loopState
	objs  []object
	// The JSON parser's member stacks, kept between parses.
	jsonKeys []string
	jsonVals []Value
	// bytes backs the strings a render builds (string "+", captured blocks, decoded JSON
	// escapes). Bytes already handed out are never written again: a string only ever grows
	// by appending past the end, and a full slab is replaced, not reused, until reset.
	bytes []byte
	// slabBytes is the string slab capacity this render has used, kept slab included.
	slabBytes int
}

const slabSize = 512

// maxKeptSlab bounds what a pooled arena keeps after an unusually large request.
const maxKeptSlab = 1 << 16

// maxKeptBytes bounds the string slab a pooled arena keeps.
const maxKeptBytes = 1 << 20

// maxRenderBytes bounds the string slabs of one render; past it strings go to the heap.
const maxRenderBytes = 16 << 20

func (a *arena) reset() {
	if cap(a.vals) > maxKeptSlab || cap(a.strs) > maxKeptSlab || cap(a.jsonVals) > maxKeptSlab || cap(a.jsonKeys) > maxKeptSlab ||
		cap(a.bytes) > maxKeptBytes {
		*a = arena{}
		return
	}
	a.bytes = a.bytes[:0]
	a.slabBytes = cap(a.bytes)
	clear(a.strs)
	a.strs = a.strs[:0]
	clear(a.vals)
	a.vals = a.vals[:0]
	clear(a.dicts)
	a.dicts = a.dicts[:0]
	clear(a.lists)
	a.lists = a.lists[:0]
	clear(a.loops)
	a.loops = a.loops[:0]
	clear(a.objs)
	a.objs = a.objs[:0]
}

func (a *arena) strSlice(n int) []string {
	if a == nil {
		return make([]string, n)
	}
	return carve(&a.strs, n)
}

func (a *arena) valSlice(n int) []Value {
	if a == nil {
		return make([]Value, n)
	}
	return carve(&a.vals, n)
}

// carve cuts n elements (capacity n, so appends never spill into the next cut) from the
// slab, starting a new slab when the current one has no room.
func carve[T any](slab *[]T, n int) []T {
	if n > cap(*slab)-len(*slab) {
		*slab = make([]T, 0, max(n, slabSize))
	}
	l := len(*slab)
	*slab = (*slab)[:l+n]
	return (*slab)[l : l+n : l+n]
}

// dict returns an empty dict with room for n keys.
func (a *arena) dict(n int) *dictVal {
	if a == nil {
		return newDict(n)
	}
	if len(a.dicts) == cap(a.dicts) {
		a.dicts = make([]dictVal, 0, slabSize/4)
	}
	a.dicts = a.dicts[:len(a.dicts)+1]
	d := &a.dicts[len(a.dicts)-1]
	d.keys = a.strSlice(n)[:0]
	d.vals = a.valSlice(n)[:0]
	return d
}

func (a *arena) list(items []Value, tuple bool) Value {
	if a == nil {
		return Value{k: kList, p: unsafe.Pointer(&listVal{items: items, isTuple: tuple})}
	}
	if len(a.lists) == cap(a.lists) {
		a.lists = make([]listVal, 0, slabSize/4)
	}
	a.lists = append(a.lists, listVal{items: items, isTuple: tuple})
	return Value{k: kList, p: unsafe.Pointer(&a.lists[len(a.lists)-1])}
}

func (a *arena) loop(items []Value) (*loopState, *object) {
	if len(a.loops) == cap(a.loops) {
		a.loops = make([]loopState, 0, 64)
	}
	a.loops = append(a.loops, loopState{items: items})
	ls := &a.loops[len(a.loops)-1]
	if len(a.objs) == cap(a.objs) {
		a.objs = make([]object, 0, 64)
	}
	a.objs = append(a.objs, object{loop: ls})
	return ls, &a.objs[len(a.objs)-1]
}

// room makes sure the string slab has n free bytes, starting a new slab (the old one stays
// alive as long as strings point into it) when it has not. It refuses, leaving the caller to
// build the string on the heap, once this render's slabs reach maxRenderBytes: slab strings
// are freed only all together, so a template that keeps rebuilding a big string must not
// pin every intermediate copy until the render ends.
func (a *arena) room(n int) bool {
	if cap(a.bytes)-len(a.bytes) >= n {
		return true
	}
	size := max(n, 2*cap(a.bytes), 4096)
	if a.slabBytes+size > maxRenderBytes {
		return false
	}
	a.slabBytes += size
	a.bytes = make([]byte, 0, size)
	return true
}

// concat returns x + y. When x is the string built last it is extended in place, so a chain
// of "+" costs one copy of each operand.
func (a *arena) concat(x, y string) string {
	if a == nil {
		return x + y
	}
	if y == "" {
		return x
	}
	if x == "" {
		return y
	}
	n := len(a.bytes)
	if len(x) <= n && cap(a.bytes)-n >= len(y) && unsafe.StringData(x) == &a.bytes[n-len(x)] {
		a.bytes = append(a.bytes, y...)
		return unsafe.String(unsafe.StringData(x), len(x)+len(y))
	}
	if !a.room(len(x) + len(y)) {
		return x + y
	}
	n = len(a.bytes)
	a.bytes = append(append(a.bytes, x...), y...)
	return unsafe.String(&a.bytes[n], len(x)+len(y))
}

// str returns a copy of b that lives until reset.
func (a *arena) str(b []byte) string {
	if a == nil || !a.room(len(b)) {
		return string(b)
	}
	if len(b) == 0 {
		return ""
	}
	n := len(a.bytes)
	a.bytes = append(a.bytes, b...)
	return unsafe.String(&a.bytes[n], len(b))
}
