package chat

// Compile-time half of the render memo (memo.go): which loops may be replayed and, in their
// bodies, which expressions are read from outside the iteration.
//
// A loop qualifies when it is not inside another loop, a macro or a block frame (so every
// expression belongs to at most one memoized body and the iteration frame is the one
// execFor pushes) and when its body neither defines macros nor sets attributes through a
// name bound inside the body (an alias of an outer namespace could not be replayed by name).
//
// Inside a qualifying body the names bound by the iteration are its targets, every name any
// statement of the body assigns, and, inside a nested loop, that loop's targets and "loop".
// Every other name is external: the outer loop's "loop", namespaces, messages, tools, the
// render variables and globals. An expression is external when all the names it reads are
// and it calls only builtins and methods (no macro: its body could read or set anything);
// ext is set on the maximal ones, so `loop.index0 > ns.last_query_index` is one recorded
// read of a bool, not two reads of values that change every turn. A name assigned in the
// body counts as bound even where it is read before the assignment (it then resolves
// outside); the evaluator catches that case at run time (lookup) and skips the record.

// markMemoLoops marks the template's qualifying loops and their external expressions.
func markMemoLoops(body []*stmt) {
	for _, s := range body {
		switch s.op {
		case sIf:
			for _, b := range s.bodies {
				markMemoLoops(b)
			}
			markMemoLoops(s.els)
		case sFor:
			markLoop(s)
		}
	}
}

func markLoop(s *stmt) {
	bound := map[string]bool{}
	for _, t := range s.targets {
		bound[t] = true
	}
	if !collectStores(s.body, bound) {
		return
	}
	if !setAttrsExternal(s.body, bound) {
		return
	}
	s.memo = true
	markBody(s.body, bound)
}

// collectStores adds every name the body assigns to bound; false if the body defines a
// macro.
func collectStores(body []*stmt, bound map[string]bool) bool {
	for _, s := range body {
		switch s.op {
		case sMacro:
			return false
		case sSet, sSetBlock, sFor:
			for _, t := range s.targets {
				bound[t] = true
			}
		}
		for _, b := range s.bodies {
			if !collectStores(b, bound) {
				return false
			}
		}
		if !collectStores(s.body, bound) || !collectStores(s.els, bound) {
			return false
		}
	}
	return true
}

func setAttrsExternal(body []*stmt, bound map[string]bool) bool {
	for _, s := range body {
		if s.op == sSetAttr && bound[s.targets[0]] {
			return false
		}
		for _, b := range s.bodies {
			if !setAttrsExternal(b, bound) {
				return false
			}
		}
		if !setAttrsExternal(s.body, bound) || !setAttrsExternal(s.els, bound) {
			return false
		}
	}
	return true
}

// markBody marks the external expressions of body, where bound holds the names bound
// inside the iteration.
func markBody(body []*stmt, bound map[string]bool) {
	for _, s := range body {
		markExpr(s.e, bound)
		for _, c := range s.conds {
			markExpr(c, bound)
		}
		for _, f := range s.filters {
			markExprArgs(f, bound)
		}
		for _, b := range s.bodies {
			markBody(b, bound)
		}
		if s.op == sFor {
			// The nested loop's "loop" is the iteration's own.
			inner := make(map[string]bool, len(bound)+1)
			for k := range bound {
				inner[k] = true
			}
			inner["loop"] = true
			// Its filter condition runs once per item too.
			markExpr(s.cond, inner)
			markBody(s.body, inner)
		} else {
			markBody(s.body, bound)
		}
		markBody(s.els, bound)
	}
}

// markExpr sets ext on the maximal external subexpressions of e that read a name (a
// constant needs no record) and reports whether e itself is external.
func markExpr(e *expr, bound map[string]bool) {
	if e == nil {
		return
	}
	if ok, named := external(e, bound); ok {
		e.ext = named
		return
	}
	markExpr(e.a, bound)
	markExpr(e.b, bound)
	markExpr(e.c, bound)
	markExprArgs(e, bound)
}

func markExprArgs(e *expr, bound map[string]bool) {
	for _, a := range e.args {
		markExpr(a, bound)
	}
	for _, k := range e.kw {
		markExpr(k.e, bound)
	}
}

// external: e reads only names outside bound and calls only builtins or methods; named: it
// reads at least one name.
func external(e *expr, bound map[string]bool) (ok, named bool) {
	if e == nil {
		return true, false
	}
	switch e.op {
	case eName:
		return !bound[e.name], true
	case eCall:
		switch {
		case e.a.op == eAttr:
		case e.a.op == eName && (e.a.name == "range" || e.a.name == "dict" || e.a.name == "strftime_now"):
			// namespace() is left out: a fresh namespace never equals a recorded one.
		default:
			return false, true
		}
	}
	ok = true
	sub := func(x *expr) {
		o, n := external(x, bound)
		ok, named = ok && o, named || n
	}
	sub(e.a)
	sub(e.b)
	sub(e.c)
	for _, a := range e.args {
		sub(a)
	}
	for _, k := range e.kw {
		sub(k.e)
	}
	return ok, named
}
