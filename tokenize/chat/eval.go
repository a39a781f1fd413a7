package chat

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"
)

// RenderError is a failure while rendering: an undefined value used where Jinja2 raises, a
// type error, a raise_exception() call from the template, a resource limit.
type RenderError struct {
	Line int
	Msg  string
}

func (e *RenderError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("chat: template error on line %d: %s", e.Line, e.Msg)
	}
	return "chat: template error: " + e.Msg
}

// Limits that keep a hostile template or request from hanging or exhausting memory.
const (
	maxRange      = 100000  // Jinja2's sandbox MAX_RANGE
	maxLoopSteps  = 1000000 // loop iterations per render
	maxMacroDepth = 64
	maxOutput     = 64 << 20
)

var errMemoMacro = errors.New("chat: macro call in a replayed read")

type binding struct {
	name string
	v    Value
}

type ctl uint8

const (
	ctlNone ctl = iota
	ctlBreak
	ctlContinue
)

type renderer struct {
	t      *Template
	out    []byte
	vars   []binding
	frames []int // start of each frame in vars; frames[0] holds the globals
	// Inside a macro call, frames in (visTop, barrier) are hidden: the macro sees its own
	// frame (barrier) and the frames up to where it was defined (visTop), as Jinja2 does.
	barrier int
	visTop  int
	now     time.Time
	steps   int
	depth   int
	a       arena
	// Call argument stacks, reused across calls and renders.
	argStack []Value
	kwStack  []kwArg

	// The render memo (memo.go): nil when off. While an iteration is recorded, recording is
	// set and recFrame is its frame; memoBad says the iteration did something the record
	// cannot capture (or, while replaying, that a read did).
	memo      *RenderMemo
	memoUse   *MemoUse
	recording bool
	replaying bool
	memoBad   bool
	recFrame  int
	recEv     []memoEvent
	lazy      []lazyRef // the recorded iteration's lazy sets (memo.go)
	undo      []memoUndo
	spans     []int
	outSpans  *[]OutSpan // Input.Spans, while a render with a memo runs
	// rootIndex maps the names of frame 0 to their index in vars once frame 0 holds more
	// than rootIndexMin bindings (many chat_template_kwargs keys): the linear scans of
	// setVar and lookup would make binding and reading them quadratic. nil otherwise.
	rootIndex map[string]int
	// The render's memo hits and misses, added to the memo's counters once at its end.
	memoHits, memoMisses uint64
}

func (r *renderer) errf(pos int, format string, a ...any) error {
	line := 0
	if pos >= 0 {
		line = lineOf(r.t.src, pos)
	}
	return &RenderError{Line: line, Msg: fmt.Sprintf(format, a...)}
}

func (r *renderer) lookup(name string) (Value, bool) {
	if r.rootIndex != nil {
		return r.lookupIndexed(name)
	}
	top := len(r.frames) - 1
	for f := top; f >= 0; f-- {
		if f < r.barrier && f > r.visTop {
			f = r.visTop + 1 // skip the caller's frames; f-- lands on visTop
			continue
		}
		end := len(r.vars)
		if f < top {
			end = r.frames[f+1]
		}
		for i := end - 1; i >= r.frames[f]; i-- {
			if r.vars[i].name == name {
				if f < r.recFrame {
					r.memoBad = true // a name bound in the body, read before its assignment
				}
				if len(r.lazy) != 0 {
					r.lazyRead(i)
				}
				return r.vars[i].v, true
			}
		}
	}
	if r.recFrame > 0 {
		r.memoBad = true
	}
	return undefinedNamed(name), false
}

// lookupIndexed is lookup with frame 0 indexed (rootIndex): the frames above it are
// scanned as lookup does, frame 0 is looked up by name. A separate function so that
// lookup, the evaluator's hottest call, keeps its loop as it was.
func (r *renderer) lookupIndexed(name string) (Value, bool) {
	top := len(r.frames) - 1
	for f := top; f >= 1; f-- {
		if f < r.barrier && f > r.visTop {
			f = r.visTop + 1
			continue
		}
		end := len(r.vars)
		if f < top {
			end = r.frames[f+1]
		}
		for i := end - 1; i >= r.frames[f]; i-- {
			if r.vars[i].name == name {
				return r.found(f, i), true
			}
		}
	}
	if i, ok := r.rootIndex[name]; ok {
		return r.found(0, i), true
	}
	if r.recFrame > 0 {
		r.memoBad = true
	}
	return undefinedNamed(name), false
}

// found is lookupIndexed's answer: binding i, in frame f.
func (r *renderer) found(f, i int) Value {
	if f < r.recFrame {
		r.memoBad = true // a name bound in the body, read before its assignment
	}
	if len(r.lazy) != 0 {
		r.lazyRead(i)
	}
	return r.vars[i].v
}

// setVar binds name in the top frame and returns the binding's index in vars.
func (r *renderer) setVar(name string, v Value) int {
	if r.rootIndex != nil && len(r.frames) == 1 {
		return r.setRoot(name, v)
	}
	start := r.frames[len(r.frames)-1]
	for i := len(r.vars) - 1; i >= start; i-- {
		if r.vars[i].name == name {
			r.vars[i].v = v
			return i
		}
	}
	r.vars = append(r.vars, binding{name, v})
	if len(r.frames) == 1 && len(r.vars) > rootIndexMin {
		r.rootIndex = make(map[string]int, 2*len(r.vars))
		for i, b := range r.vars {
			r.rootIndex[b.name] = i
		}
	}
	return len(r.vars) - 1
}

// setRoot is setVar in an indexed frame 0.
func (r *renderer) setRoot(name string, v Value) int {
	if i, ok := r.rootIndex[name]; ok {
		r.vars[i].v = v
		return i
	}
	r.vars = append(r.vars, binding{name, v})
	r.rootIndex[name] = len(r.vars) - 1
	return len(r.vars) - 1
}

// rootIndexMin is the size of frame 0 past which it is indexed (see renderer.rootIndex); a
// chat request binds about twenty names there.
const rootIndexMin = 64

// maxKeptVars bounds the bindings a pooled renderer keeps after a render.
const maxKeptVars = 1024

func (r *renderer) pushFrame() { r.frames = append(r.frames, len(r.vars)) }

// bindUndef makes the frame's compile-time locals undefined until they are assigned.
func (r *renderer) bindUndef(names []string) {
	for _, n := range names {
		r.setVar(n, undefinedNamed(n))
	}
}

// execFrame runs body in a frame of its own (set and filter blocks, {% generation %}).
func (r *renderer) execFrame(body []*stmt, undef []string) (ctl, error) {
	r.pushFrame()
	r.bindUndef(undef)
	c, err := r.execBody(body)
	r.popFrame()
	return c, err
}

func (r *renderer) popFrame() {
	top := len(r.frames) - 1
	clear(r.vars[r.frames[top]:])
	r.vars = r.vars[:r.frames[top]]
	r.frames = r.frames[:top]
}

func (r *renderer) execBody(body []*stmt) (ctl, error) {
	for _, s := range body {
		c, err := r.exec(s)
		if err != nil || c != ctlNone {
			return c, err
		}
	}
	if len(r.out) > maxOutput {
		return ctlNone, r.errf(-1, "output larger than %d bytes", maxOutput)
	}
	return ctlNone, nil
}

func (r *renderer) exec(s *stmt) (ctl, error) {
	switch s.op {
	case sText:
		r.out = append(r.out, s.text...)
	case sOutput:
		return ctlNone, r.output(s.e)
	case sIf:
		for i, c := range s.conds {
			v, err := r.eval(c)
			if err != nil {
				return ctlNone, err
			}
			if v.truth() {
				return r.execBody(s.bodies[i])
			}
		}
		return r.execBody(s.els)
	case sFor:
		return r.execFor(s)
	case sSet:
		ev := len(r.recEv)
		v, err := r.eval(s.e)
		if err != nil {
			return ctlNone, err
		}
		if len(s.targets) == 1 {
			i := r.setVar(s.targets[0], v)
			if s.lazy && r.recording && len(r.recEv) == ev+1 && r.recEv[ev].e == s.e {
				r.recEv[ev].lazy = true // until the name is read (memo.go)
				r.lazy = append(r.lazy, lazyRef{slot: i, ev: ev})
			}
			return ctlNone, nil
		}
		items, err := r.unpack(v, len(s.targets), s.pos)
		if err != nil {
			return ctlNone, err
		}
		for i, n := range s.targets {
			r.setVar(n, items[i])
		}
	case sSetAttr:
		frame := r.recFrame
		r.recFrame = 0 // the target is external (memo_scan.go): not a stray read
		ns, _ := r.lookup(s.targets[0])
		r.recFrame = frame
		if ns.k != kNS {
			return ctlNone, r.errf(s.pos, "cannot assign attribute on non-namespace object")
		}
		v, err := r.eval(s.e)
		if err != nil {
			return ctlNone, err
		}
		ns.dct().set(s.attr, v)
		if r.recording {
			r.recEv = append(r.recEv, memoEvent{s: s, v: v})
		}
	case sSetBlock:
		v, err := r.captureFrame(s.body, s.undef)
		if err != nil {
			return ctlNone, err
		}
		for _, f := range s.filters {
			if v, err = r.applyFilter(f, v); err != nil {
				return ctlNone, err
			}
		}
		r.setVar(s.targets[0], v)
	case sFilterBlock:
		v, err := r.captureFrame(s.body, s.undef)
		if err != nil {
			return ctlNone, err
		}
		for _, f := range s.filters {
			if v, err = r.applyFilter(f, v); err != nil {
				return ctlNone, err
			}
		}
		r.out = appendStr(r.out, v)
	case sMacro:
		r.setVar(s.targets[0], r.macroValue(s))
	case sBreak:
		return ctlBreak, nil
	case sContinue:
		return ctlContinue, nil
	case sBlock:
		return r.execFrame(s.body, s.undef)
	}
	return ctlNone, nil
}

// capture renders body into a string without touching the output.
func (r *renderer) capture(body []*stmt) (Value, error) {
	mark := len(r.out)
	_, err := r.execBody(body)
	s := r.a.str(r.out[mark:])
	r.out = r.out[:mark]
	return strVal(s), err
}

func (r *renderer) captureFrame(body []*stmt, undef []string) (Value, error) {
	r.pushFrame()
	r.bindUndef(undef)
	v, err := r.capture(body)
	r.popFrame()
	return v, err
}

// output writes {{ e }}. Chains of string "+" or "~" are streamed into the output instead of
// building intermediate strings; operands are evaluated once, left to right, as in Python.
func (r *renderer) output(e *expr) error {
	if e.ext && r.recording {
		// Recorded whole (the fast paths below would read its parts unrecorded).
		v, err := r.eval(e)
		if err != nil {
			return err
		}
		r.out = appendStr(r.out, v)
		return nil
	}
	if e.op == eFilter && e.name == "tojson" {
		v, err := r.eval(e.a)
		if err != nil {
			return err
		}
		r.out, err = r.appendToJSON(r.out, e, v)
		return err
	}
	if e.op == eBin && (e.name == "+" || e.name == "~") {
		var buf [16]*expr
		leaves := collectChain(buf[:0], e, e.name)
		if len(leaves) <= len(buf) {
			return r.outputChain(leaves, e)
		}
	}
	v, err := r.eval(e)
	if err != nil {
		return err
	}
	r.out = appendStr(r.out, v)
	return nil
}

func collectChain(dst []*expr, e *expr, op string) []*expr {
	if e.op == eBin && e.name == op {
		dst = collectChain(dst, e.a, op)
		return append(dst, e.b)
	}
	return append(dst, e)
}

func (r *renderer) outputChain(leaves []*expr, root *expr) error {
	mark := len(r.out)
	for i, l := range leaves {
		v, err := r.eval(l)
		if err != nil {
			return err
		}
		if root.name == "~" {
			r.out = appendStr(r.out, v)
			continue
		}
		if v.k != kString {
			// Not a pure string chain: fold the rest generically from what was written.
			acc := v
			if i > 0 {
				acc, err = r.binop("+", strVal(string(r.out[mark:])), v, l.pos)
				if err != nil {
					return err
				}
			}
			r.out = r.out[:mark]
			for _, rest := range leaves[i+1:] {
				w, err := r.eval(rest)
				if err != nil {
					return err
				}
				if acc, err = r.binop("+", acc, w, rest.pos); err != nil {
					return err
				}
			}
			r.out = appendStr(r.out, acc)
			return nil
		}
		r.out = append(r.out, v.s...)
	}
	return nil
}

func (r *renderer) unpack(v Value, n int, pos int) ([]Value, error) {
	var items []Value
	switch v.k {
	case kList:
		items = v.lst().items
	case kString:
		for _, c := range v.s {
			items = append(items, strVal(string(c)))
		}
	default:
		return nil, r.errf(pos, "cannot unpack non-iterable %s object", v.typeName())
	}
	if len(items) != n {
		return nil, r.errf(pos, "cannot unpack %d values into %d names", len(items), n)
	}
	return items, nil
}

// iterate returns the items a for loop walks: list items, dict keys, string characters.
func (r *renderer) iterate(v Value, pos int) ([]Value, error) {
	switch v.k {
	case kList:
		return v.lst().items, nil
	case kDict, kNS:
		out := make([]Value, len(v.dct().keys))
		for i, k := range v.dct().keys {
			out[i] = strVal(k)
		}
		return out, nil
	case kString:
		out := make([]Value, 0, len(v.s))
		for _, c := range v.s {
			out = append(out, strVal(string(c)))
		}
		return out, nil
	case kUndefined:
		return nil, nil
	}
	return nil, r.errf(pos, "'%s' object is not iterable", v.typeName())
}

type loopState struct {
	items []Value
	i     int
}

func (r *renderer) execFor(s *stmt) (ctl, error) {
	seq, err := r.eval(s.e)
	if err != nil {
		return ctlNone, err
	}
	items, err := r.iterate(seq, s.pos)
	if err != nil {
		return ctlNone, err
	}
	if s.cond != nil {
		// The loop filter runs first, so loop.length counts only the kept items.
		var kept []Value
		for _, it := range items {
			r.pushFrame()
			if err := r.bindTargets(s, it); err != nil {
				r.popFrame()
				return ctlNone, err
			}
			v, err := r.eval(s.cond)
			r.popFrame()
			if err != nil {
				return ctlNone, err
			}
			if v.truth() {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		if len(s.els) == 0 {
			return ctlNone, nil
		}
		return r.execFrame(s.els, s.elsUndef)
	}
	ls, obj := r.a.loop(items)
	loopVal := Value{k: kLoop, p: unsafe.Pointer(obj)}
	memo := s.memo && r.memo != nil && !r.recording && (s.memoStored.Load() > 0 || s.memoEmpty.Load() < memoQuietLoop)
	for i, it := range items {
		r.steps++
		if r.steps > maxLoopSteps {
			return ctlNone, r.errf(s.pos, "too many loop iterations")
		}
		ls.i = i
		r.pushFrame()
		r.bindUndef(s.undef)
		r.vars = append(r.vars, binding{"loop", loopVal})
		if err := r.bindTargets(s, it); err != nil {
			r.popFrame()
			return ctlNone, err
		}
		var c ctl
		if memo {
			c, err = r.execMemoIter(s, it)
		} else {
			c, err = r.execBody(s.body)
		}
		r.popFrame()
		if err != nil {
			return ctlNone, err
		}
		if c == ctlBreak {
			break
		}
	}
	return ctlNone, nil
}

// execMemoIter runs one iteration of a memoized loop (its frame bound): replayed from the
// memo when a record matches, else evaluated and recorded.
func (r *renderer) execMemoIter(s *stmt, it Value) (ctl, error) {
	h := r.memo.iterKey(s, it)
	if r.memoUse != nil {
		r.memoUse.Iterations++
	}
	if c, ok := r.replay(s, it, h); ok {
		if r.memoUse != nil {
			r.memoUse.Replayed++
		}
		return c, nil
	}
	mark, steps := len(r.out), r.steps
	r.recording, r.memoBad, r.recFrame = true, false, len(r.frames)-1
	r.recEv = r.recEv[:0]
	c, err := r.execBody(s.body)
	r.recording, r.recFrame = false, 0
	r.lazy = r.lazy[:0]
	if err == nil {
		r.commit(s, it, h, mark, c, r.steps-steps)
	}
	clear(r.recEv)
	r.recEv = r.recEv[:0]
	r.memoBad = false
	return c, err
}

func (r *renderer) bindTargets(s *stmt, it Value) error {
	if len(s.targets) == 1 {
		r.vars = append(r.vars, binding{s.targets[0], it})
		return nil
	}
	parts, err := r.unpack(it, len(s.targets), s.pos)
	if err != nil {
		return err
	}
	for i, n := range s.targets {
		r.vars = append(r.vars, binding{n, parts[i]})
	}
	return nil
}

func (r *renderer) loopAttr(ls *loopState, name string) Value {
	n := len(ls.items)
	switch name {
	case "index":
		return intVal(int64(ls.i + 1))
	case "index0":
		return intVal(int64(ls.i))
	case "revindex":
		return intVal(int64(n - ls.i))
	case "revindex0":
		return intVal(int64(n - ls.i - 1))
	case "first":
		return boolVal(ls.i == 0)
	case "last":
		return boolVal(ls.i == n-1)
	case "length":
		return intVal(int64(n))
	case "depth":
		return intVal(1)
	case "depth0":
		return intVal(0)
	case "previtem":
		if ls.i > 0 {
			return ls.items[ls.i-1]
		}
		return undefinedNamed("previtem")
	case "nextitem":
		if ls.i+1 < n {
			return ls.items[ls.i+1]
		}
		return undefinedNamed("nextitem")
	case "cycle":
		return Value{k: kCycle, p: unsafe.Pointer(&object{loop: ls, name: "cycle"})}
	}
	return undefinedNamed(name)
}

func (r *renderer) macroValue(s *stmt) Value {
	defFrame := len(r.frames) - 1
	return Value{k: kFunc, p: unsafe.Pointer(&object{name: s.targets[0], macro: true, fn: func(r *renderer, args []Value, kw []kwArg) (Value, error) {
		if r.depth >= maxMacroDepth {
			return undefined, r.errf(s.pos, "macro recursion too deep")
		}
		if len(args) > len(s.params) {
			return undefined, r.errf(s.pos, "macro '%s' takes not more than %d argument(s)", s.targets[0], len(s.params))
		}
		savedBarrier, savedVis := r.barrier, r.visTop
		r.pushFrame()
		r.barrier = len(r.frames) - 1
		r.visTop = min(defFrame, r.barrier-1)
		r.depth++
		defer func() {
			r.depth--
			r.popFrame()
			r.barrier, r.visTop = savedBarrier, savedVis
		}()
		firstDef := len(s.params) - len(s.defs)
		for i, p := range s.params {
			var v Value
			found := false
			if i < len(args) {
				v, found = args[i], true
			}
			for _, k := range kw {
				if k.name == p {
					if found {
						return undefined, r.errf(s.pos, "macro '%s' got multiple values for argument '%s'", s.targets[0], p)
					}
					v, found = k.v, true
				}
			}
			if !found {
				if i >= firstDef {
					dv, err := r.eval(s.defs[i-firstDef])
					if err != nil {
						return undefined, err
					}
					v = dv
				} else {
					v = undefinedNamed(p)
				}
			}
			r.vars = append(r.vars, binding{p, v})
		}
		r.bindUndef(s.undef)
		for _, k := range kw {
			known := false
			for _, p := range s.params {
				known = known || p == k.name
			}
			if !known {
				return undefined, r.errf(s.pos, "macro '%s' takes no keyword argument '%s'", s.targets[0], k.name)
			}
		}
		return r.capture(s.body)
	}})}
}

func (r *renderer) eval(e *expr) (Value, error) {
	if e.ext && r.recording {
		return r.recordRead(e)
	}
	switch e.op {
	case eConst:
		return e.val, nil
	case eName:
		v, _ := r.lookup(e.name)
		return v, nil
	case eAttr:
		// message.role and the like: the common shapes go without a nested eval call and
		// without getAttr's method-name checks (plainAttr is decided at parse time).
		var obj Value
		if e.a.op == eName {
			obj, _ = r.lookup(e.a.name)
		} else {
			var err error
			if obj, err = r.eval(e.a); err != nil {
				return undefined, err
			}
		}
		if (obj.k == kDict && e.plainAttr) || obj.k == kNS {
			if v, ok := obj.dct().get(e.name); ok {
				return v, nil
			}
			return undefinedNamed(e.name), nil
		}
		return r.getAttr(obj, e.name, e.pos)
	case eItem:
		obj, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		key, err := r.eval(e.b)
		if err != nil {
			return undefined, err
		}
		return r.getItem(obj, key, e.pos)
	case eSlice:
		obj, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		var idx [3]Value
		for i, p := range e.args {
			idx[i] = none
			if p != nil {
				if idx[i], err = r.eval(p); err != nil {
					return undefined, err
				}
			}
		}
		return r.slice(obj, idx[0], idx[1], idx[2], e.pos)
	case eCall:
		return r.call(e)
	case eFilter:
		v, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		if v.k == kList && e.name == "length" && len(e.args) == 0 && len(e.kw) == 0 {
			return intVal(int64(len(v.lst().items))), nil // messages|length
		}
		return r.applyFilter(e, v)
	case eTest:
		v, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		ok, err := r.applyTest(e, v)
		if err != nil {
			return undefined, err
		}
		return boolVal(ok != e.neg), nil
	case eNeg, ePos:
		v, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		switch v.k {
		case kInt, kBool:
			if e.op == eNeg {
				return intVal(-v.n), nil
			}
			return intVal(v.n), nil
		case kFloat:
			if e.op == eNeg {
				return floatVal(-v.float()), nil
			}
			return v, nil
		case kUndefined:
			return undefined, r.undefinedErr(v, e.pos)
		}
		return undefined, r.errf(e.pos, "bad operand type for unary -: '%s'", v.typeName())
	case eNot:
		v, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		return boolVal(!v.truth()), nil
	case eAnd:
		a, err := r.eval(e.a)
		if err != nil || !a.truth() {
			return a, err
		}
		return r.eval(e.b)
	case eOr:
		a, err := r.eval(e.a)
		if err != nil || a.truth() {
			return a, err
		}
		return r.eval(e.b)
	case eBin:
		a, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		b, err := r.eval(e.b)
		if err != nil {
			return undefined, err
		}
		return r.binop(e.name, a, b, e.pos)
	case eCompare:
		a, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		b, err := r.eval(e.b)
		if err != nil {
			return undefined, err
		}
		if a.k == kString && b.k == kString && len(e.name) == 2 && e.name[1] == '=' && (e.name[0] == '=' || e.name[0] == '!') {
			return boolVal((a.s == b.s) == (e.name[0] == '=')), nil // == and != on strings
		}
		ok, err := r.compare(e.name, a, b, e.pos)
		return boolVal(ok), err
	case eCond:
		c, err := r.eval(e.a)
		if err != nil {
			return undefined, err
		}
		if c.truth() {
			return r.eval(e.b)
		}
		if e.c == nil {
			return undefined, nil
		}
		return r.eval(e.c)
	case eList, eTuple:
		items := make([]Value, len(e.args))
		for i, a := range e.args {
			v, err := r.eval(a)
			if err != nil {
				return undefined, err
			}
			items[i] = v
		}
		return Value{k: kList, p: unsafe.Pointer(&listVal{items: items, isTuple: e.op == eTuple})}, nil
	case eDict:
		d := r.a.dict(len(e.args) / 2)
		for i := 0; i < len(e.args); i += 2 {
			k, err := r.eval(e.args[i])
			if err != nil {
				return undefined, err
			}
			if k.k != kString {
				return undefined, r.errf(e.pos, "only string dict keys are supported")
			}
			v, err := r.eval(e.args[i+1])
			if err != nil {
				return undefined, err
			}
			d.set(k.s, v)
		}
		return dictValue(d), nil
	}
	return undefined, r.errf(e.pos, "unknown expression")
}

func (r *renderer) undefinedErr(v Value, pos int) error {
	if v.s != "" {
		return r.errf(pos, "'%s' is undefined", v.s)
	}
	return r.errf(pos, "undefined value used")
}

func (r *renderer) getAttr(obj Value, name string, pos int) (Value, error) {
	switch obj.k {
	case kDict:
		if isDictMethod(name) {
			return boundMethod(obj, name), nil
		}
		if v, ok := obj.dct().get(name); ok {
			return v, nil
		}
		return undefinedNamed(name), nil
	case kNS:
		if v, ok := obj.dct().get(name); ok {
			return v, nil
		}
		return undefinedNamed(name), nil
	case kLoop:
		return r.loopAttr(obj.obj().loop, name), nil
	case kString:
		if isStrMethod(name) {
			return boundMethod(obj, name), nil
		}
	case kList:
		if name == "index" || name == "count" || isMutatingListMethod(name) {
			return boundMethod(obj, name), nil
		}
	case kUndefined:
		return undefined, r.undefinedErr(obj, pos)
	}
	return undefinedNamed(name), nil
}

func (r *renderer) getItem(obj Value, key Value, pos int) (Value, error) {
	switch obj.k {
	case kDict, kNS:
		if key.k == kString {
			if v, ok := obj.dct().get(key.s); ok {
				return v, nil
			}
			if obj.k == kDict && isDictMethod(key.s) {
				return boundMethod(obj, key.s), nil
			}
		}
		return undefinedNamed(toStr(key)), nil
	case kList:
		if key.k == kInt || key.k == kBool {
			i := key.n
			n := int64(len(obj.lst().items))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return obj.lst().items[i], nil
			}
			return undefined, nil
		}
		if key.k == kString {
			return r.getAttr(obj, key.s, pos)
		}
	case kString:
		if key.k == kInt || key.k == kBool {
			runes := []rune(obj.s)
			i := key.n
			n := int64(len(runes))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return strVal(string(runes[i])), nil
			}
			return undefined, nil
		}
		if key.k == kString {
			return r.getAttr(obj, key.s, pos)
		}
	case kLoop:
		if key.k == kString {
			return r.loopAttr(obj.obj().loop, key.s), nil
		}
	case kUndefined:
		return undefined, r.undefinedErr(obj, pos)
	}
	return undefined, nil
}

// sliceBounds resolves Python slice indices for a sequence of length n.
func sliceBounds(n int, start, stop, step Value) (int, int, int, error) {
	st := 1
	if step.k != kNone {
		if step.k != kInt {
			return 0, 0, 0, errors.New("slice indices must be integers")
		}
		st = int(step.n)
		if st == 0 {
			return 0, 0, 0, errors.New("slice step cannot be zero")
		}
	}
	idx := func(v Value, def int) (int, error) {
		if v.k == kNone {
			return def, nil
		}
		if v.k != kInt && v.k != kBool {
			return 0, errors.New("slice indices must be integers or None")
		}
		i := int(v.n)
		if i < 0 {
			i += n
			if i < 0 {
				if st < 0 {
					i = -1
				} else {
					i = 0
				}
			}
		} else if i >= n {
			if st < 0 {
				i = n - 1
			} else {
				i = n
			}
		}
		return i, nil
	}
	var a, b int
	var err error
	if st > 0 {
		if a, err = idx(start, 0); err != nil {
			return 0, 0, 0, err
		}
		if b, err = idx(stop, n); err != nil {
			return 0, 0, 0, err
		}
	} else {
		if a, err = idx(start, n-1); err != nil {
			return 0, 0, 0, err
		}
		if b, err = idx(stop, -1); err != nil {
			return 0, 0, 0, err
		}
	}
	return a, b, st, nil
}

func (r *renderer) slice(obj, start, stop, step Value, pos int) (Value, error) {
	switch obj.k {
	case kList:
		a, b, st, err := sliceBounds(len(obj.lst().items), start, stop, step)
		if err != nil {
			return undefined, r.errf(pos, "%v", err)
		}
		n := 0
		if st > 0 && b > a {
			n = (b - a + st - 1) / st
		} else if st < 0 && a > b {
			n = (a - b - st - 1) / -st
		}
		out := r.a.valSlice(n)
		for j := range out {
			out[j] = obj.lst().items[a+j*st]
		}
		return r.a.list(out, obj.lst().isTuple), nil
	case kString:
		runes := []rune(obj.s)
		a, b, st, err := sliceBounds(len(runes), start, stop, step)
		if err != nil {
			return undefined, r.errf(pos, "%v", err)
		}
		var sb strings.Builder
		for i := a; (st > 0 && i < b) || (st < 0 && i > b); i += st {
			sb.WriteRune(runes[i])
		}
		return strVal(sb.String()), nil
	case kUndefined:
		return undefined, r.undefinedErr(obj, pos)
	}
	return undefined, r.errf(pos, "'%s' object is not subscriptable", obj.typeName())
}

func (r *renderer) binop(op string, a, b Value, pos int) (Value, error) {
	if op == "~" {
		return strVal(r.a.concat(toStr(a), toStr(b))), nil
	}
	if op == "%" && a.k == kString && b.k == kUndefined {
		// str % Undefined: Undefined passes Python's mapping check, so a format without
		// specifiers is returned as is (and "%s" prints it as "").
		s, err := pyPercentFormat(a.s, b)
		if err != nil {
			return undefined, r.errf(pos, "%v", err)
		}
		return strVal(s), nil
	}
	if a.k == kUndefined {
		return undefined, r.undefinedErr(a, pos)
	}
	if b.k == kUndefined {
		return undefined, r.undefinedErr(b, pos)
	}
	switch op {
	case "+":
		switch {
		case a.k == kString && b.k == kString:
			return strVal(r.a.concat(a.s, b.s)), nil
		case a.k == kList && b.k == kList && a.lst().isTuple == b.lst().isTuple:
			items := make([]Value, 0, len(a.lst().items)+len(b.lst().items))
			items = append(append(items, a.lst().items...), b.lst().items...)
			return Value{k: kList, p: unsafe.Pointer(&listVal{items: items, isTuple: a.lst().isTuple})}, nil
		}
	case "*":
		if (a.k == kString || a.k == kList) && (b.k == kInt || b.k == kBool) {
			return r.repeat(pos, a, b.n)
		}
		if (b.k == kString || b.k == kList) && (a.k == kInt || a.k == kBool) {
			return r.repeat(pos, b, a.n)
		}
	case "%":
		if a.k == kString {
			s, err := pyPercentFormat(a.s, b)
			if err != nil {
				return undefined, r.errf(pos, "%v", err)
			}
			return strVal(s), nil
		}
	}
	if !a.isNumber() || !b.isNumber() {
		return undefined, r.errf(pos, "unsupported operand type(s) for %s: '%s' and '%s'", op, a.typeName(), b.typeName())
	}
	if a.k != kFloat && b.k != kFloat {
		x, y := a.n, b.n
		switch op {
		case "+":
			return intVal(x + y), nil
		case "-":
			return intVal(x - y), nil
		case "*":
			return intVal(x * y), nil
		case "/":
			if y == 0 {
				return undefined, r.errf(pos, "division by zero")
			}
			return floatVal(float64(x) / float64(y)), nil
		case "//":
			if y == 0 {
				return undefined, r.errf(pos, "integer division or modulo by zero")
			}
			q := x / y
			if (x%y != 0) && ((x < 0) != (y < 0)) {
				q--
			}
			return intVal(q), nil
		case "%":
			if y == 0 {
				return undefined, r.errf(pos, "integer division or modulo by zero")
			}
			m := x % y
			if m != 0 && ((m < 0) != (y < 0)) {
				m += y
			}
			return intVal(m), nil
		case "**":
			if y >= 0 {
				// By squaring: a template's x ** 1e18 must not spin for ages (the product
				// wraps mod 2^64 exactly as repeated multiplication would).
				res, base := int64(1), x
				for e := y; e > 0; e >>= 1 {
					if e&1 == 1 {
						res *= base
					}
					base *= base
				}
				return intVal(res), nil
			}
			return floatVal(math.Pow(float64(x), float64(y))), nil
		}
	}
	x, y := a.num(), b.num()
	switch op {
	case "+":
		return floatVal(x + y), nil
	case "-":
		return floatVal(x - y), nil
	case "*":
		return floatVal(x * y), nil
	case "/":
		if y == 0 {
			return undefined, r.errf(pos, "float division by zero")
		}
		return floatVal(x / y), nil
	case "//":
		if y == 0 {
			return undefined, r.errf(pos, "float floor division by zero")
		}
		return floatVal(math.Floor(x / y)), nil
	case "%":
		if y == 0 {
			return undefined, r.errf(pos, "float modulo")
		}
		m := math.Mod(x, y)
		if m != 0 && ((m < 0) != (y < 0)) {
			m += y
		}
		return floatVal(m), nil
	case "**":
		return floatVal(math.Pow(x, y)), nil
	}
	return undefined, r.errf(pos, "unsupported operator %s", op)
}

func (r *renderer) repeat(pos int, v Value, n int64) (Value, error) {
	if n < 0 {
		n = 0
	}
	// Bounded like the output: `'x' * 10**12` is an error, never an out-of-memory crash.
	size := int64(len(v.s))
	if v.k == kList {
		size = int64(len(v.lst().items)) * 16
	}
	if size == 0 {
		n = 0 // an empty string or list repeats to itself, however large n is
	}
	if size > 0 && n > maxOutput/size {
		return undefined, r.errf(pos, "repetition larger than %d bytes", maxOutput)
	}
	if v.k == kString {
		return strVal(strings.Repeat(v.s, int(n))), nil
	}
	items := make([]Value, 0, len(v.lst().items)*int(n))
	for i := int64(0); i < n; i++ {
		items = append(items, v.lst().items...)
	}
	return Value{k: kList, p: unsafe.Pointer(&listVal{items: items, isTuple: v.lst().isTuple})}, nil
}

// equal is Python ==.
func equal(a, b Value) bool {
	if a.isNumber() && b.isNumber() {
		if a.k != kFloat && b.k != kFloat {
			return a.n == b.n
		}
		return a.num() == b.num()
	}
	if a.k != b.k {
		return false
	}
	switch a.k {
	case kUndefined, kNone:
		return true
	case kString:
		return a.s == b.s
	case kList:
		if a.lst().isTuple != b.lst().isTuple || len(a.lst().items) != len(b.lst().items) {
			return false
		}
		for i := range a.lst().items {
			if !equal(a.lst().items[i], b.lst().items[i]) {
				return false
			}
		}
		return true
	case kDict:
		if len(a.dct().keys) != len(b.dct().keys) {
			return false
		}
		for i, k := range a.dct().keys {
			w, ok := b.dct().get(k)
			if !ok || !equal(a.dct().vals[i], w) {
				return false
			}
		}
		return true
	}
	return a.p == b.p
}

// less is Python <; ok is false when the types do not order.
func less(a, b Value) (bool, bool) {
	if a.isNumber() && b.isNumber() {
		if a.k != kFloat && b.k != kFloat {
			return a.n < b.n, true
		}
		return a.num() < b.num(), true
	}
	if a.k == kString && b.k == kString {
		return a.s < b.s, true
	}
	if a.k == kList && b.k == kList && a.lst().isTuple == b.lst().isTuple {
		for i := 0; i < len(a.lst().items) && i < len(b.lst().items); i++ {
			if !equal(a.lst().items[i], b.lst().items[i]) {
				return less(a.lst().items[i], b.lst().items[i])
			}
		}
		return len(a.lst().items) < len(b.lst().items), true
	}
	return false, false
}

func (r *renderer) compare(op string, a, b Value, pos int) (bool, error) {
	switch op {
	case "==":
		return equal(a, b), nil
	case "!=":
		return !equal(a, b), nil
	case "in", "notin":
		ok, err := r.contains(b, a, pos)
		if op == "notin" {
			ok = !ok
		}
		return ok, err
	}
	var lt, ok bool
	switch op {
	case "<":
		lt, ok = less(a, b)
	case ">":
		lt, ok = less(b, a)
	case "<=":
		lt, ok = less(b, a)
		lt = !lt
	case ">=":
		lt, ok = less(a, b)
		lt = !lt
	}
	if !ok {
		if a.k == kUndefined {
			return false, r.undefinedErr(a, pos)
		}
		if b.k == kUndefined {
			return false, r.undefinedErr(b, pos)
		}
		return false, r.errf(pos, "'%s' not supported between instances of '%s' and '%s'", op, a.typeName(), b.typeName())
	}
	return lt, nil
}

func (r *renderer) contains(container, item Value, pos int) (bool, error) {
	switch container.k {
	case kString:
		if item.k != kString {
			if item.k == kUndefined {
				return false, r.undefinedErr(item, pos)
			}
			return false, r.errf(pos, "'in <string>' requires string as left operand, not %s", item.typeName())
		}
		return strings.Contains(container.s, item.s), nil
	case kList:
		for _, it := range container.lst().items {
			if equal(it, item) {
				return true, nil
			}
		}
		return false, nil
	case kDict, kNS:
		if item.k != kString {
			if !hashable(item) {
				return false, r.errf(pos, "unhashable type: '%s'", item.typeName())
			}
			return false, nil
		}
		_, ok := container.dct().get(item.s)
		return ok, nil
	case kUndefined:
		return false, nil
	}
	return false, r.errf(pos, "argument of type '%s' is not iterable", container.typeName())
}

func (r *renderer) call(e *expr) (Value, error) {
	// Method calls on strings, dicts and lists dispatch directly, without a bound object.
	var self Value
	var fn Value
	var err error
	method := ""
	if e.a.op == eAttr {
		if self, err = r.eval(e.a.a); err != nil {
			return undefined, err
		}
		switch {
		case self.k == kString && isStrMethod(e.a.name),
			self.k == kDict && isDictMethod(e.a.name),
			self.k == kList && (e.a.name == "index" || e.a.name == "count" || isMutatingListMethod(e.a.name)):
			method = e.a.name
		default:
			if fn, err = r.getAttr(self, e.a.name, e.a.pos); err != nil {
				return undefined, err
			}
		}
	} else if fn, err = r.eval(e.a); err != nil {
		return undefined, err
	}
	// Arguments go on the renderer's stacks: a call nested in an argument pushes above them
	// and pops back before the next one is pushed. The callee gets full slices (no spare
	// capacity), so nothing it appends can overwrite a later push.
	argBase, kwBase := len(r.argStack), len(r.kwStack)
	defer func() {
		r.argStack = r.argStack[:argBase]
		r.kwStack = r.kwStack[:kwBase]
	}()
	for _, a := range e.args {
		v, err := r.eval(a)
		if err != nil {
			return undefined, err
		}
		r.argStack = append(r.argStack, v)
	}
	for _, k := range e.kw {
		v, err := r.eval(k.e)
		if err != nil {
			return undefined, err
		}
		r.kwStack = append(r.kwStack, kwArg{k.name, v})
	}
	args := r.argStack[argBase:len(r.argStack):len(r.argStack)]
	var kw []kwArg
	if len(r.kwStack) > kwBase {
		kw = r.kwStack[kwBase:len(r.kwStack):len(r.kwStack)]
	}
	if method != "" {
		return r.callMethod(self, method, args, kw, e.pos)
	}
	switch fn.k {
	case kFunc:
		if fn.obj().fn == nil {
			return r.callMethod(fn.obj().self, fn.obj().name, args, kw, e.pos)
		}
		if fn.obj().macro && (r.recording || r.replaying) {
			// A macro may read or set anything: the record cannot capture it, and a replay
			// must not run its side effects before it gives up.
			r.memoBad = true
			if r.replaying {
				return undefined, errMemoMacro
			}
		}
		return fn.obj().fn(r, args, kw)
	case kCycle:
		if r.recording {
			r.memoBad = true
		}
		if len(args) == 0 {
			return undefined, r.errf(e.pos, "no items for cycling given")
		}
		return args[fn.obj().loop.i%len(args)], nil
	case kUndefined:
		return undefined, r.undefinedErr(fn, e.pos)
	}
	return undefined, r.errf(e.pos, "'%s' object is not callable", fn.typeName())
}

func boundMethod(self Value, name string) Value {
	return Value{k: kFunc, p: unsafe.Pointer(&object{name: name, self: self})}
}
