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
//
// A single-name set whose value is external and totalInt is marked lazy: its read is
// recorded only if the iteration reads the name (memo.go). messages|length counts as total
// only when nothing in the template binds messages (the render binds it to a list).

// markMemoLoops marks the template's qualifying loops and their external expressions.
func markMemoLoops(body []*stmt) {
	markLoops(body, !assigns(body, "messages"))
}

// markLoops: msgsList says the name messages is the render's messages list everywhere
// (nothing in the template binds it; chat_template_kwargs may not).
func markLoops(body []*stmt, msgsList bool) {
	for _, s := range body {
		switch s.op {
		case sIf:
			for _, b := range s.bodies {
				markLoops(b, msgsList)
			}
			markLoops(s.els, msgsList)
		case sFor:
			markLoop(s, msgsList)
		}
	}
}

// assigns reports whether any statement of body, at any depth (macro bodies included, to
// keep it simple), binds name.
func assigns(body []*stmt, name string) bool {
	for _, s := range body {
		for _, t := range s.targets {
			if t == name {
				return true
			}
		}
		for _, p := range s.params {
			if p == name {
				return true
			}
		}
		for _, b := range s.bodies {
			if assigns(b, name) {
				return true
			}
		}
		if assigns(s.body, name) || assigns(s.els, name) {
			return true
		}
	}
	return false
}

func markLoop(s *stmt, msgsList bool) {
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
	markBody(s.body, bound, msgsList)
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
func markBody(body []*stmt, bound map[string]bool, msgsList bool) {
	for _, s := range body {
		markExpr(s.e, bound)
		if s.op == sSet && len(s.targets) == 1 && s.e != nil && s.e.ext {
			s.lazy = totalInt(s.e, msgsList)
		}
		for _, c := range s.conds {
			markExpr(c, bound)
		}
		for _, f := range s.filters {
			markExprArgs(f, bound)
		}
		for _, b := range s.bodies {
			markBody(b, bound, msgsList)
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
			markBody(s.body, inner, msgsList)
		} else {
			markBody(s.body, bound, msgsList)
		}
		markBody(s.els, bound, msgsList)
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

// totalInt reports whether the external expression e always evaluates to an int without an
// error, whatever the render's values: int constants, the memoized loop's own loop.index,
// index0, revindex, revindex0 and length (an external "loop" in its body is that loop's),
// messages|length (or count) when msgsList, and + or - of those (int arithmetic in the
// evaluator never fails). A lazy set (memo.go) may leave such an expression unevaluated on
// replay because its evaluation has no effect but its value.
func totalInt(e *expr, msgsList bool) bool {
	switch e.op {
	case eConst:
		return e.val.k == kInt
	case eAttr:
		if e.a.op != eName || e.a.name != "loop" {
			return false
		}
		switch e.name {
		case "index", "index0", "revindex", "revindex0", "length":
			return true
		}
	case eFilter:
		return msgsList && (e.name == "length" || e.name == "count") && len(e.args) == 0 && len(e.kw) == 0 &&
			e.a.op == eName && e.a.name == "messages"
	case eBin:
		return (e.name == "+" || e.name == "-") && totalInt(e.a, msgsList) && totalInt(e.b, msgsList)
	}
	return false
}
