package chat

import (
	"fmt"
	"sync/atomic"
)

type exprOp uint8

const (
	eConst exprOp = iota
	eName
	eAttr    // a.name
	eItem    // a[b]
	eSlice   // a[b:c:d] (nil parts allowed)
	eCall    // a(args, kw)
	eFilter  // a | name(args, kw)
	eTest    // a is [not] name(args)
	eNeg     // -a
	ePos     // +a
	eNot     // not a
	eAnd     // a and b
	eOr      // a or b
	eBin     // a <name> b : + - * / // % ** ~
	eCompare // a <name> b : == != < > <= >= in notin
	eCond    // b if a else c
	eList
	eTuple
	eDict // args = k1, v1, k2, v2...
)

type expr struct {
	op      exprOp
	val     Value
	name    string
	a, b, c *expr
	args    []*expr
	kw      []kwExpr
	neg     bool
	// plainAttr (eAttr): name is no dict method, so on a dict it is a key lookup.
	plainAttr bool
	// ext (inside a memoized loop's body): every name the expression reads is bound outside
	// the loop body and it calls nothing but builtins, so the render memo records its value
	// (see memo.go).
	ext bool
	pos int
}

type kwExpr struct {
	name string
	e    *expr
}

type stmtOp uint8

const (
	sText stmtOp = iota
	sOutput
	sIf
	sFor
	sSet      // targets = e
	sSetAttr  // targets[0].attr = e (namespace)
	sSetBlock // targets[0] = rendered body
	sMacro
	sBreak
	sContinue
	sBlock // plain body (generation, filter blocks without filters)
	sFilterBlock
)

type stmt struct {
	op      stmtOp
	text    string
	e       *expr
	targets []string
	attr    string
	body    []*stmt
	els     []*stmt
	conds   []*expr   // if / elif conditions
	bodies  [][]*stmt // if / elif bodies
	cond    *expr     // for ... if cond
	params  []string
	defs    []*expr // macro defaults, aligned to the end of params
	filters []*expr // filter block / set block filters (a == nil)
	// Names that are frame-local and undefined when the frame this statement opens starts
	// (see scope.go); elsUndef for a for loop's else block.
	undef, elsUndef []string
	// memo (sFor): the loop's iterations may be replayed from a RenderMemo (see memo.go).
	memo bool
	// memoEmpty and memoStored count this loop's recorded iterations without output (not
	// stored unless they dropped a lazy set's read) and stored: a loop that only ever sets
	// namespace attributes from the values it reads is cheaper evaluated than recorded, so
	// after memoQuietLoop empty ones and none stored it is no longer memoized. Only a cost
	// decision: any answer is exact.
	memoEmpty, memoStored atomic.Int32
	// lazy (sSet in a memoized body, one target, an external totalInt value): an iteration's
	// record keeps the value only if the iteration reads the name (memo.go).
	lazy bool
	pos  int
}

type parser struct {
	src  string
	toks []token
	i    int
}

func (p *parser) errAt(pos int, format string, a ...any) error {
	return &SyntaxError{Line: lineOf(p.src, pos), Msg: fmt.Sprintf(format, a...)}
}

func (p *parser) peek() token {
	if p.i < len(p.toks) {
		return p.toks[p.i]
	}
	return token{t: tEOF, pos: len(p.src)}
}

func (p *parser) next() token {
	t := p.peek()
	if p.i < len(p.toks) {
		p.i++
	}
	return t
}

func (p *parser) isOp(s string) bool {
	t := p.peek()
	return t.t == tOp && t.s == s
}

func (p *parser) isName(s string) bool {
	t := p.peek()
	return t.t == tName && t.s == s
}

func (p *parser) expectOp(s string) error {
	t := p.next()
	if t.t != tOp || t.s != s {
		return p.errAt(t.pos, "expected '%s', got %s", s, describe(t))
	}
	return nil
}

func (p *parser) expectName() (string, error) {
	t := p.next()
	if t.t != tName {
		return "", p.errAt(t.pos, "expected a name, got %s", describe(t))
	}
	return t.s, nil
}

func (p *parser) expectBlockEnd() error {
	t := p.next()
	if t.t != tBlockEnd {
		return p.errAt(t.pos, "expected end of statement block, got %s", describe(t))
	}
	return nil
}

func describe(t token) string {
	switch t.t {
	case tEOF:
		return "end of template"
	case tData:
		return "template data"
	case tVarEnd:
		return "'}}'"
	case tBlockEnd:
		return "'%}'"
	case tVarBegin:
		return "'{{'"
	case tBlockBegin:
		return "'{%'"
	case tString:
		return "string"
	case tInt, tFloat:
		return "number"
	}
	return "'" + t.s + "'"
}

func parse(src string) ([]*stmt, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{src: src, toks: toks}
	body, end, err := p.parseBody(nil)
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, p.errAt(p.peek().pos, "unexpected '%s'", end)
	}
	return body, nil
}

// parseBody reads statements until one of the end keywords (returned, with its block-begin
// and name consumed) or the end of the template.
func (p *parser) parseBody(ends []string) ([]*stmt, string, error) {
	var body []*stmt
	for {
		t := p.next()
		switch t.t {
		case tEOF:
			if len(ends) > 0 {
				return nil, "", p.errAt(t.pos, "unexpected end of template, expected '%s'", ends[0])
			}
			return body, "", nil
		case tData:
			body = append(body, &stmt{op: sText, text: t.s, pos: t.pos})
		case tVarBegin:
			e, err := p.parseExpr()
			if err != nil {
				return nil, "", err
			}
			if nt := p.next(); nt.t != tVarEnd {
				return nil, "", p.errAt(nt.pos, "expected '}}', got %s", describe(nt))
			}
			body = append(body, &stmt{op: sOutput, e: e, pos: t.pos})
		case tBlockBegin:
			kw := p.peek()
			if kw.t != tName {
				return nil, "", p.errAt(kw.pos, "expected a statement name, got %s", describe(kw))
			}
			for _, e := range ends {
				if kw.s == e {
					p.next()
					return body, e, nil
				}
			}
			s, err := p.parseStmt()
			if err != nil {
				return nil, "", err
			}
			if s != nil {
				body = append(body, s)
			}
		default:
			return nil, "", p.errAt(t.pos, "unexpected %s", describe(t))
		}
	}
}

func (p *parser) parseStmt() (*stmt, error) {
	kw := p.next()
	switch kw.s {
	case "if":
		return p.parseIf(kw.pos)
	case "for":
		return p.parseFor(kw.pos)
	case "set":
		return p.parseSet(kw.pos)
	case "macro":
		return p.parseMacro(kw.pos)
	case "break", "continue":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if kw.s == "break" {
			return &stmt{op: sBreak, pos: kw.pos}, nil
		}
		return &stmt{op: sContinue, pos: kw.pos}, nil
	case "generation":
		// transformers' AssistantTracker extension: the body renders as is.
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody([]string{"endgeneration"})
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		return &stmt{op: sBlock, body: body, pos: kw.pos}, nil
	case "filter":
		filters, err := p.parseFilterChain()
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody([]string{"endfilter"})
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		return &stmt{op: sFilterBlock, body: body, filters: filters, pos: kw.pos}, nil
	}
	return nil, p.errAt(kw.pos, "unknown tag '%s'", kw.s)
}

func (p *parser) parseIf(pos int) (*stmt, error) {
	s := &stmt{op: sIf, pos: pos}
	for {
		// Jinja2 parses if/elif conditions without conditional expressions.
		c, err := p.parseTupleNoCond()
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody([]string{"elif", "else", "endif"})
		if err != nil {
			return nil, err
		}
		s.conds = append(s.conds, c)
		s.bodies = append(s.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			els, _, err := p.parseBody([]string{"endif"})
			if err != nil {
				return nil, err
			}
			s.els = els
		}
		return s, p.expectBlockEnd()
	}
}

func (p *parser) parseTargets() ([]string, error) {
	var names []string
	paren := p.isOp("(")
	if paren {
		p.next()
	}
	for {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		names = append(names, n)
		if !p.isOp(",") {
			break
		}
		p.next()
		if paren && p.isOp(")") {
			break
		}
	}
	if paren {
		if err := p.expectOp(")"); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func (p *parser) parseFor(pos int) (*stmt, error) {
	targets, err := p.parseTargets()
	if err != nil {
		return nil, err
	}
	if !p.isName("in") {
		return nil, p.errAt(p.peek().pos, "expected 'in'")
	}
	p.next()
	it, err := p.parseTupleNoCond()
	if err != nil {
		return nil, err
	}
	s := &stmt{op: sFor, targets: targets, e: it, pos: pos}
	if p.isName("if") {
		p.next()
		if s.cond, err = p.parseExpr(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.errAt(p.peek().pos, "recursive loops are not supported")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody([]string{"else", "endfor"})
	if err != nil {
		return nil, err
	}
	s.body = body
	if end == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if s.els, _, err = p.parseBody([]string{"endfor"}); err != nil {
			return nil, err
		}
	}
	return s, p.expectBlockEnd()
}

func (p *parser) parseSet(pos int) (*stmt, error) {
	first, err := p.expectName()
	if err != nil {
		return nil, err
	}
	if p.isOp(".") {
		p.next()
		attr, err := p.expectName()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		e, err := p.parseTupleOrExpr()
		if err != nil {
			return nil, err
		}
		return &stmt{op: sSetAttr, targets: []string{first}, attr: attr, e: e, pos: pos}, p.expectBlockEnd()
	}
	targets := []string{first}
	for p.isOp(",") {
		p.next()
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		targets = append(targets, n)
	}
	if p.isOp("=") {
		p.next()
		e, err := p.parseTupleOrExpr()
		if err != nil {
			return nil, err
		}
		return &stmt{op: sSet, targets: targets, e: e, pos: pos}, p.expectBlockEnd()
	}
	if len(targets) != 1 {
		return nil, p.errAt(pos, "expected '='")
	}
	var filters []*expr
	if p.isOp("|") {
		p.next()
		if filters, err = p.parseFilterChain(); err != nil {
			return nil, err
		}
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody([]string{"endset"})
	if err != nil {
		return nil, err
	}
	return &stmt{op: sSetBlock, targets: targets, body: body, filters: filters, pos: pos}, p.expectBlockEnd()
}

func (p *parser) parseMacro(pos int) (*stmt, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	s := &stmt{op: sMacro, targets: []string{name}, pos: pos}
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.isOp(")") {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		s.params = append(s.params, n)
		if p.isOp("=") {
			p.next()
			d, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			s.defs = append(s.defs, d)
		} else if len(s.defs) > 0 {
			return nil, p.errAt(p.peek().pos, "non-default argument follows default argument")
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if err := p.expectOp(")"); err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody([]string{"endmacro"})
	if err != nil {
		return nil, err
	}
	s.body = body
	return s, p.expectBlockEnd()
}

// parseFilterChain reads "name(args) | name ..." (the leading "|" already consumed or absent).
func (p *parser) parseFilterChain() ([]*expr, error) {
	var out []*expr
	for {
		f, err := p.parseFilterCall(nil)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
		if !p.isOp("|") {
			return out, nil
		}
		p.next()
	}
}

// Expressions, by Jinja2's precedence.

func (p *parser) parseTupleOrExpr() (*expr, error) {
	return p.parseTuple(true)
}

func (p *parser) parseTupleNoCond() (*expr, error) {
	return p.parseTuple(false)
}

func (p *parser) parseTuple(withCond bool) (*expr, error) {
	pos := p.peek().pos
	parse := p.parseExpr
	if !withCond {
		parse = p.parseOr
	}
	first, err := parse()
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return first, nil
	}
	items := []*expr{first}
	for p.isOp(",") {
		p.next()
		if t := p.peek(); t.t == tBlockEnd || t.t == tVarEnd || (t.t == tName && t.s == "if") {
			break
		}
		e, err := parse()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &expr{op: eTuple, args: items, pos: pos}, nil
}

func (p *parser) parseExpr() (*expr, error) {
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		pos := p.next().pos
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var other *expr
		if p.isName("else") {
			p.next()
			if other, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		e = &expr{op: eCond, a: cond, b: e, c: other, pos: pos}
	}
	return e, nil
}

func (p *parser) parseOr() (*expr, error) {
	a, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.isName("or") {
		pos := p.next().pos
		b, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		a = &expr{op: eOr, a: a, b: b, pos: pos}
	}
	return a, nil
}

func (p *parser) parseAnd() (*expr, error) {
	a, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.isName("and") {
		pos := p.next().pos
		b, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		a = &expr{op: eAnd, a: a, b: b, pos: pos}
	}
	return a, nil
}

func (p *parser) parseNot() (*expr, error) {
	if p.isName("not") {
		pos := p.next().pos
		a, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &expr{op: eNot, a: a, pos: pos}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (*expr, error) {
	a, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		op := ""
		switch {
		case t.t == tOp && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == ">" || t.s == "<=" || t.s == ">="):
			op = t.s
			p.next()
		case t.t == tName && t.s == "in":
			op = "in"
			p.next()
		case t.t == tName && t.s == "not" && p.i+1 < len(p.toks) && p.toks[p.i+1].t == tName && p.toks[p.i+1].s == "in":
			op = "notin"
			p.next()
			p.next()
		default:
			return a, nil
		}
		b, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		// Chained comparisons (a < b < c) are rare in chat templates; they fold left here,
		// with Python's meaning kept by evaluating pairwise in eval.
		a = &expr{op: eCompare, name: op, a: a, b: b, pos: t.pos}
	}
}

func (p *parser) parseMath1() (*expr, error) {
	a, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		t := p.next()
		b, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		a = &expr{op: eBin, name: t.s, a: a, b: b, pos: t.pos}
	}
	return a, nil
}

func (p *parser) parseConcat() (*expr, error) {
	a, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	for p.isOp("~") {
		t := p.next()
		b, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		a = &expr{op: eBin, name: "~", a: a, b: b, pos: t.pos}
	}
	return a, nil
}

func (p *parser) parseMath2() (*expr, error) {
	a, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		t := p.next()
		b, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		a = &expr{op: eBin, name: t.s, a: a, b: b, pos: t.pos}
	}
	return a, nil
}

func (p *parser) parsePow() (*expr, error) {
	a, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.isOp("**") {
		t := p.next()
		b, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		a = &expr{op: eBin, name: "**", a: a, b: b, pos: t.pos}
	}
	return a, nil
}

func (p *parser) parseUnary(withFilter bool) (*expr, error) {
	t := p.peek()
	var e *expr
	var err error
	switch {
	case t.t == tOp && t.s == "-":
		p.next()
		a, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &expr{op: eNeg, a: a, pos: t.pos}
	case t.t == tOp && t.s == "+":
		p.next()
		a, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &expr{op: ePos, a: a, pos: t.pos}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *parser) parsePrimary() (*expr, error) {
	t := p.next()
	switch t.t {
	case tName:
		switch t.s {
		case "true", "True":
			return &expr{op: eConst, val: vTrue, pos: t.pos}, nil
		case "false", "False":
			return &expr{op: eConst, val: vFalse, pos: t.pos}, nil
		case "none", "None":
			return &expr{op: eConst, val: none, pos: t.pos}, nil
		}
		return &expr{op: eName, name: t.s, pos: t.pos}, nil
	case tString:
		s := t.s
		// Adjacent string literals concatenate, as in Jinja2.
		for p.peek().t == tString {
			s += p.next().s
		}
		return &expr{op: eConst, val: strVal(s), pos: t.pos}, nil
	case tInt:
		return &expr{op: eConst, val: intVal(t.n), pos: t.pos}, nil
	case tFloat:
		return &expr{op: eConst, val: floatVal(t.f), pos: t.pos}, nil
	case tOp:
		switch t.s {
		case "(":
			if p.isOp(")") {
				p.next()
				return &expr{op: eTuple, pos: t.pos}, nil
			}
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if p.isOp(",") {
				items := []*expr{e}
				for p.isOp(",") {
					p.next()
					if p.isOp(")") {
						break
					}
					x, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					items = append(items, x)
				}
				e = &expr{op: eTuple, args: items, pos: t.pos}
			}
			return e, p.expectOp(")")
		case "[":
			var items []*expr
			for !p.isOp("]") {
				x, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				items = append(items, x)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return &expr{op: eList, args: items, pos: t.pos}, p.expectOp("]")
		case "{":
			var items []*expr
			for !p.isOp("}") {
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				items = append(items, k, v)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return &expr{op: eDict, args: items, pos: t.pos}, p.expectOp("}")
		}
	}
	return nil, p.errAt(t.pos, "unexpected %s", describe(t))
}

func (p *parser) parsePostfix(e *expr) (*expr, error) {
	for {
		t := p.peek()
		if t.t != tOp {
			return e, nil
		}
		switch t.s {
		case ".":
			p.next()
			nt := p.next()
			switch nt.t {
			case tName:
				e = &expr{op: eAttr, a: e, name: nt.s, plainAttr: !isDictMethod(nt.s), pos: nt.pos}
			case tInt:
				e = &expr{op: eItem, a: e, b: &expr{op: eConst, val: intVal(nt.n)}, pos: nt.pos}
			default:
				return nil, p.errAt(nt.pos, "expected an attribute name")
			}
		case "[":
			p.next()
			var parts [3]*expr
			isSlice := false
			idx := 0
			for !p.isOp("]") {
				if p.isOp(":") {
					p.next()
					isSlice = true
					idx++
					if idx > 2 {
						return nil, p.errAt(t.pos, "bad slice")
					}
					continue
				}
				x, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				parts[idx] = x
				if !isSlice && p.isOp(",") {
					return nil, p.errAt(t.pos, "tuple subscripts are not supported")
				}
			}
			p.next()
			if isSlice {
				e = &expr{op: eSlice, a: e, args: []*expr{parts[0], parts[1], parts[2]}, pos: t.pos}
			} else {
				if parts[0] == nil {
					return nil, p.errAt(t.pos, "empty subscript")
				}
				e = &expr{op: eItem, a: e, b: parts[0], pos: t.pos}
			}
		case "(":
			p.next()
			args, kw, err := p.parseArgs()
			if err != nil {
				return nil, err
			}
			e = &expr{op: eCall, a: e, args: args, kw: kw, pos: t.pos}
		default:
			return e, nil
		}
	}
}

// parseArgs reads call arguments after "(" through ")".
func (p *parser) parseArgs() ([]*expr, []kwExpr, error) {
	var args []*expr
	var kw []kwExpr
	for !p.isOp(")") {
		if t := p.peek(); t.t == tName && p.i+1 < len(p.toks) && p.toks[p.i+1].t == tOp && p.toks[p.i+1].s == "=" {
			p.next()
			p.next()
			v, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			kw = append(kw, kwExpr{name: t.s, e: v})
		} else {
			if len(kw) > 0 {
				return nil, nil, p.errAt(t.pos, "positional argument follows keyword argument")
			}
			v, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, v)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return args, kw, p.expectOp(")")
}

func (p *parser) parseFilterCall(subject *expr) (*expr, error) {
	t := p.peek()
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.isOp(".") { // dotted filter names
		p.next()
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n
	}
	f := &expr{op: eFilter, a: subject, name: name, pos: t.pos}
	if p.isOp("(") {
		p.next()
		if f.args, f.kw, err = p.parseArgs(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) parseFilterExpr(e *expr) (*expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			f, err := p.parseFilterCall(e)
			if err != nil {
				return nil, err
			}
			e = f
		case p.isName("is"):
			pos := p.next().pos
			neg := false
			if p.isName("not") {
				p.next()
				neg = true
			}
			name, err := p.expectName()
			if err != nil {
				return nil, err
			}
			for p.isOp(".") {
				p.next()
				n, err := p.expectName()
				if err != nil {
					return nil, err
				}
				name += "." + n
			}
			te := &expr{op: eTest, a: e, name: name, neg: neg, pos: pos}
			t := p.peek()
			switch {
			case t.t == tOp && t.s == "(":
				p.next()
				if te.args, te.kw, err = p.parseArgs(); err != nil {
					return nil, err
				}
			case t.t == tString || t.t == tInt || t.t == tFloat ||
				(t.t == tOp && (t.s == "[" || t.s == "{")) ||
				(t.t == tName && t.s != "else" && t.s != "or" && t.s != "and"):
				if t.t == tName && t.s == "is" {
					return nil, p.errAt(t.pos, "You cannot chain multiple tests with is")
				}
				arg, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				if arg, err = p.parsePostfix(arg); err != nil {
					return nil, err
				}
				te.args = []*expr{arg}
			}
			e = te
		default:
			return e, nil
		}
	}
}
