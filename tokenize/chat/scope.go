package chat

// Jinja2 decides at compile time where each name lives. In every frame (the template, a for
// body, a for-else, a macro, a set block, a filter block) a name whose first reference is an
// unconditional assignment, and that no enclosing frame refers to, is a fresh local that is
// undefined until assigned: it hides a render variable of the same name, and nested loops or
// macros that read it before the assignment see it undefined. Names first read, or assigned
// only in some branches of an if, resolve to the enclosing value instead, which is what a
// dynamic lookup gives. analyzeScopes computes the first kind per frame; the evaluator binds
// those names to Undefined when it enters the frame.

type refKind uint8

const (
	refResolve refKind = iota // read from the enclosing frames / render variables
	refUndef                  // frame-local, undefined until assigned
	refParam                  // loop target or macro parameter
)

type symbols struct {
	parent *symbols
	refs   map[string]refKind
	stores map[string]bool
}

func newSymbols(parent *symbols) *symbols {
	return &symbols{parent: parent, refs: map[string]refKind{}, stores: map[string]bool{}}
}

func (s *symbols) findRef(name string) bool {
	for x := s; x != nil; x = x.parent {
		if _, ok := x.refs[name]; ok {
			return true
		}
	}
	return false
}

func (s *symbols) copy() *symbols {
	c := newSymbols(s.parent)
	for k, v := range s.refs {
		c.refs[k] = v
	}
	for k := range s.stores {
		c.stores[k] = true
	}
	return c
}

func (s *symbols) store(name string) {
	s.stores[name] = true
	if _, ok := s.refs[name]; ok {
		return
	}
	if s.parent != nil && s.parent.findRef(name) {
		s.refs[name] = refResolve // an alias of the enclosing variable
		return
	}
	s.refs[name] = refUndef
}

func (s *symbols) param(name string) {
	s.stores[name] = true
	s.refs[name] = refParam
}

func (s *symbols) load(name string) {
	if !s.findRef(name) {
		s.refs[name] = refResolve
	}
}

// branchUpdate merges the symbol tables of an if's three branch groups (body, elifs, else):
// a name assigned in some groups only resolves to the enclosing value.
func (s *symbols) branchUpdate(branches [3]*symbols) {
	count := map[string]int{}
	for _, b := range branches {
		for t := range b.stores {
			if !s.stores[t] {
				count[t]++
			}
		}
	}
	for _, b := range branches {
		for k, v := range b.refs {
			s.refs[k] = v
		}
		for k := range b.stores {
			s.stores[k] = true
		}
	}
	for name, n := range count {
		if n != len(branches) {
			s.refs[name] = refResolve
		}
	}
}

func (s *symbols) undefNames() []string {
	var out []string
	for k, v := range s.refs {
		if v == refUndef {
			out = append(out, k)
		}
	}
	sortStrings(out)
	return out
}

func sortStrings(a []string) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// analyzeScopes annotates every frame-opening statement with its undefined-at-entry names and
// returns the template root's.
func analyzeScopes(body []*stmt) []string {
	root := newSymbols(nil)
	frameVisitBody(root, body)
	analyzeNested(root, body)
	return root.undefNames()
}

// frameVisitBody visits statements as they belong to one frame (nested frames only
// contribute the parts evaluated in this frame: a loop's iterable, a filter's arguments).
func frameVisitBody(s *symbols, body []*stmt) {
	for _, st := range body {
		frameVisitStmt(s, st)
	}
}

func frameVisitStmt(s *symbols, st *stmt) {
	switch st.op {
	case sOutput:
		visitExprLoads(s, st.e)
	case sIf:
		frameVisitIf(s, st, 0)
	case sFor:
		visitExprLoads(s, st.e)
	case sSet:
		visitExprLoads(s, st.e)
		for _, t := range st.targets {
			s.store(t)
		}
	case sSetAttr:
		visitExprLoads(s, st.e)
		s.load(st.targets[0])
	case sSetBlock:
		s.store(st.targets[0])
	case sFilterBlock:
		for _, f := range st.filters {
			visitExprLoads(s, f)
		}
	case sMacro:
		s.store(st.targets[0])
	}
}

// frameVisitIf visits the if whose first condition is st.conds[i]; its elifs form one branch
// group (each an if of its own), as in Jinja2's tree.
func frameVisitIf(s *symbols, st *stmt, i int) {
	visitExprLoads(s, st.conds[i])
	body := s.copy()
	frameVisitBody(body, st.bodies[i])
	elifs := s.copy()
	if i+1 < len(st.conds) {
		frameVisitIf(elifs, st, i+1)
	}
	els := s.copy()
	if i == 0 {
		// The else belongs to the first if; Jinja2's elif nodes have empty else groups.
		frameVisitBody(els, st.els)
	}
	s.branchUpdate([3]*symbols{body, elifs, els})
}

func visitExprLoads(s *symbols, e *expr) {
	if e == nil {
		return
	}
	if e.op == eName {
		s.load(e.name)
		return
	}
	visitExprLoads(s, e.a)
	visitExprLoads(s, e.b)
	visitExprLoads(s, e.c)
	for _, a := range e.args {
		visitExprLoads(s, a)
	}
	for _, k := range e.kw {
		visitExprLoads(s, k.e)
	}
}

// analyzeNested analyzes the frames opened inside body (whose own symbols are s).
func analyzeNested(s *symbols, body []*stmt) {
	for _, st := range body {
		switch st.op {
		case sIf:
			for _, b := range st.bodies {
				analyzeNested(s, b)
			}
			analyzeNested(s, st.els)
		case sFor:
			inner := newSymbols(s)
			for _, t := range st.targets {
				inner.param(t)
			}
			frameVisitBody(inner, st.body)
			st.undef = inner.undefNames()
			analyzeNested(inner, st.body)
			if len(st.els) > 0 {
				els := newSymbols(s)
				frameVisitBody(els, st.els)
				st.elsUndef = els.undefNames()
				analyzeNested(els, st.els)
			}
		case sMacro:
			inner := newSymbols(s)
			for _, p := range st.params {
				inner.param(p)
			}
			for _, d := range st.defs {
				visitExprLoads(inner, d)
			}
			frameVisitBody(inner, st.body)
			st.undef = inner.undefNames()
			analyzeNested(inner, st.body)
		case sSetBlock, sFilterBlock, sBlock:
			inner := newSymbols(s)
			frameVisitBody(inner, st.body)
			st.undef = inner.undefNames()
			analyzeNested(inner, st.body)
		}
	}
}
