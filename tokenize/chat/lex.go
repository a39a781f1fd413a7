package chat

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The lexer follows Jinja2's rules as transformers configures them: trim_blocks (drop the
// first newline after a block or comment tag), lstrip_blocks (drop spaces and tabs between a
// line start and a block or comment tag), "-" and "+" whitespace control, the trailing
// newline of the template dropped, newlines normalised to "\n".

type tokType uint8

const (
	tEOF tokType = iota
	tData
	tVarBegin
	tVarEnd
	tBlockBegin
	tBlockEnd
	tName
	tString
	tInt
	tFloat
	tOp
)

type token struct {
	t   tokType
	s   string // text: name, op, data, unescaped string literal
	n   int64
	f   float64
	pos int // byte offset in the normalised source, for error messages
}

type lexer struct {
	src          string
	pos          int
	toks         []token
	lineStarting bool
}

// SyntaxError reports a template that does not parse.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("chat: template syntax error on line %d: %s", e.Line, e.Msg)
}

func lineOf(src string, pos int) int {
	if pos > len(src) {
		pos = len(src)
	}
	return strings.Count(src[:pos], "\n") + 1
}

func normalizeNewlines(src string) string {
	if strings.IndexByte(src, '\r') >= 0 {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	// keep_trailing_newline=False: one final newline is dropped.
	return strings.TrimSuffix(src, "\n")
}

func lex(src string) ([]token, error) {
	lx := &lexer{src: src, lineStarting: true}
	if err := lx.run(); err != nil {
		return nil, err
	}
	return lx.toks, nil
}

func (lx *lexer) errAt(pos int, format string, a ...any) error {
	return &SyntaxError{Line: lineOf(lx.src, pos), Msg: fmt.Sprintf(format, a...)}
}

func (lx *lexer) emitData(text string, pos int) {
	if text != "" {
		lx.toks = append(lx.toks, token{t: tData, s: text, pos: pos})
	}
}

// stripBefore applies "-" (rstrip everything) or lstrip_blocks to the text before a tag.
func (lx *lexer) stripBefore(text string, sign byte, isVar bool) string {
	if sign == '-' {
		return pyStrip(text, false, true)
	}
	if sign != '+' && !isVar {
		lpos := strings.LastIndexByte(text, '\n') + 1
		if lpos > 0 || lx.lineStarting {
			rest := text[lpos:]
			if strings.Trim(rest, " \t") == "" {
				return text[:lpos]
			}
		}
	}
	return text
}

func (lx *lexer) run() error {
	src := lx.src
	for lx.pos < len(src) {
		start := lx.pos
		i := indexTagStart(src, start)
		if i < 0 {
			lx.emitData(src[start:], start)
			return nil
		}
		kindCh := src[i+1]
		sign := byte(0)
		if i+2 < len(src) && (src[i+2] == '-' || src[i+2] == '+') {
			sign = src[i+2]
		}
		text := src[start:i]
		after := i + 2
		if sign != 0 {
			after++
		}
		switch kindCh {
		case '#':
			lx.emitData(lx.stripBefore(text, sign, false), start)
			end := strings.Index(src[after:], "#}")
			if end < 0 {
				return lx.errAt(i, "missing end of comment tag")
			}
			endPos := after + end
			lx.pos = endPos + 2
			switch {
			case endPos > after && src[endPos-1] == '-':
				lx.pos = skipPySpace(src, lx.pos)
			case endPos > after && src[endPos-1] == '+':
				// "+#}" keeps the newline that trim_blocks would drop.
			case lx.pos < len(src) && src[lx.pos] == '\n':
				lx.pos++
			}
			lx.lineStarting = lx.pos > 0 && src[lx.pos-1] == '\n'
		case '{':
			lx.emitData(lx.stripBefore(text, sign, true), start)
			lx.toks = append(lx.toks, token{t: tVarBegin, pos: i})
			lx.pos = after
			if err := lx.lexInside(true); err != nil {
				return err
			}
		case '%':
			if name, rawEnd, ok := lx.rawTag(after); ok && name == "raw" {
				lx.emitData(lx.stripBefore(text, sign, false), start)
				lx.lineStarting = src[rawEnd-1] == '\n'
				if err := lx.lexRaw(rawEnd, i); err != nil {
					return err
				}
				continue
			}
			lx.emitData(lx.stripBefore(text, sign, false), start)
			lx.toks = append(lx.toks, token{t: tBlockBegin, pos: i})
			lx.pos = after
			if err := lx.lexInside(false); err != nil {
				return err
			}
		}
	}
	return nil
}

func indexTagStart(src string, from int) int {
	for {
		j := strings.IndexByte(src[from:], '{')
		if j < 0 {
			return -1
		}
		j += from
		if j+1 < len(src) {
			switch src[j+1] {
			case '{', '%', '#':
				return j
			}
		}
		from = j + 1
	}
}

func skipPySpace(src string, pos int) int {
	for pos < len(src) {
		r, n := utf8.DecodeRuneInString(src[pos:])
		if !isPySpace(r) {
			break
		}
		pos += n
	}
	return pos
}

// rawTag peeks at a block tag's first word and where the tag ends (for {% raw %}).
func (lx *lexer) rawTag(pos int) (string, int, bool) {
	return lx.rawTagEnd(pos, false)
}

// rawTagEnd is rawTag; allowPlus also accepts "+%}" (which {% endraw %} may use, {% raw %}
// may not).
func (lx *lexer) rawTagEnd(pos int, allowPlus bool) (string, int, bool) {
	src := lx.src
	p := pos
	for p < len(src) && isPySpaceByte(src[p]) {
		p++
	}
	q := p
	for q < len(src) && isNameByte(src[q]) {
		q++
	}
	name := src[p:q]
	for q < len(src) && isPySpaceByte(src[q]) {
		q++
	}
	if strings.HasPrefix(src[q:], "-%}") {
		return name, skipPySpace(src, q+3), true
	}
	if strings.HasPrefix(src[q:], "%}") {
		return name, q + 2, true
	}
	if allowPlus && strings.HasPrefix(src[q:], "+%}") {
		return name, q + 3, true
	}
	return name, 0, false
}

func (lx *lexer) lexRaw(bodyStart, tagPos int) error {
	src := lx.src
	from := bodyStart
	for {
		j := strings.Index(src[from:], "{%")
		if j < 0 {
			return lx.errAt(tagPos, "missing endraw")
		}
		j += from
		p := j + 2
		sign := byte(0)
		if p < len(src) && (src[p] == '-' || src[p] == '+') {
			sign = src[p]
			p++
		}
		name, end, ok := lx.rawTagEnd(p, true)
		if !ok || name != "endraw" {
			from = j + 2
			continue
		}
		lx.emitData(lx.stripBefore(src[bodyStart:j], sign, false), bodyStart)
		lx.pos = end
		// "%}" takes trim_blocks' newline; "-%}" already took all whitespace; "+%}" none.
		if src[end-1] == '}' && end < len(src) && src[end] == '\n' && src[end-3] != '-' && src[end-3] != '+' {
			lx.pos++
		}
		lx.lineStarting = lx.pos > 0 && src[lx.pos-1] == '\n'
		return nil
	}
}

func isPySpaceByte(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isNameByte(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// lexInside tokenises an expression or statement until its closing delimiter. A closing
// delimiter inside open brackets does not count, as in Jinja2.
func (lx *lexer) lexInside(isVar bool) error {
	src := lx.src
	depth := 0
	begin := lx.pos
	for {
		for lx.pos < len(src) && isPySpaceByte(src[lx.pos]) {
			lx.pos++
		}
		if lx.pos >= len(src) {
			if isVar {
				return lx.errAt(begin, "unexpected end of template, expected '}}'")
			}
			return lx.errAt(begin, "unexpected end of template, expected '%%}'")
		}
		rest := src[lx.pos:]
		if depth == 0 {
			if isVar {
				if strings.HasPrefix(rest, "-}}") {
					lx.toks = append(lx.toks, token{t: tVarEnd, pos: lx.pos})
					lx.pos = skipPySpace(src, lx.pos+3)
					lx.lineStarting = src[lx.pos-1] == '\n'
					return nil
				}
				if strings.HasPrefix(rest, "}}") {
					lx.toks = append(lx.toks, token{t: tVarEnd, pos: lx.pos})
					lx.pos += 2
					lx.lineStarting = false
					return nil
				}
			} else {
				if strings.HasPrefix(rest, "-%}") {
					lx.toks = append(lx.toks, token{t: tBlockEnd, pos: lx.pos})
					lx.pos = skipPySpace(src, lx.pos+3)
					lx.lineStarting = src[lx.pos-1] == '\n'
					return nil
				}
				if strings.HasPrefix(rest, "+%}") {
					lx.toks = append(lx.toks, token{t: tBlockEnd, pos: lx.pos})
					lx.pos += 3
					lx.lineStarting = false
					return nil
				}
				if strings.HasPrefix(rest, "%}") {
					lx.toks = append(lx.toks, token{t: tBlockEnd, pos: lx.pos})
					lx.pos += 2
					if lx.pos < len(src) && src[lx.pos] == '\n' {
						lx.pos++
						lx.lineStarting = true
					} else {
						lx.lineStarting = false
					}
					return nil
				}
			}
		}
		c := src[lx.pos]
		switch {
		case c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'):
			q := lx.pos
			for q < len(src) && isNameByte(src[q]) {
				q++
			}
			lx.toks = append(lx.toks, token{t: tName, s: src[lx.pos:q], pos: lx.pos})
			lx.pos = q
		case c >= '0' && c <= '9':
			if err := lx.lexNumber(); err != nil {
				return err
			}
		case c == '\'' || c == '"':
			if err := lx.lexString(c); err != nil {
				return err
			}
		default:
			op := ""
			for _, cand := range [...]string{"//", "**", "==", "!=", "<=", ">="} {
				if strings.HasPrefix(rest, cand) {
					op = cand
					break
				}
			}
			if op == "" {
				if strings.IndexByte("+-*/%~<>=()[]{},.:|;", c) < 0 {
					return lx.errAt(lx.pos, "unexpected char %q", c)
				}
				op = rest[:1]
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				if depth == 0 {
					return lx.errAt(lx.pos, "unexpected '%s'", op)
				}
				depth--
			}
			lx.toks = append(lx.toks, token{t: tOp, s: op, pos: lx.pos})
			lx.pos += len(op)
		}
	}
}

func (lx *lexer) lexNumber() error {
	src := lx.src
	q := lx.pos
	digits := func() {
		for q < len(src) && (src[q] >= '0' && src[q] <= '9' || src[q] == '_') {
			q++
		}
	}
	digits()
	isFloat := false
	if q+1 < len(src) && src[q] == '.' && src[q+1] >= '0' && src[q+1] <= '9' {
		isFloat = true
		q++
		digits()
	}
	if q < len(src) && (src[q] == 'e' || src[q] == 'E') {
		r := q + 1
		if r < len(src) && (src[r] == '+' || src[r] == '-') {
			r++
		}
		if r < len(src) && src[r] >= '0' && src[r] <= '9' {
			isFloat = true
			q = r
			digits()
		}
	}
	text := strings.ReplaceAll(src[lx.pos:q], "_", "")
	if isFloat {
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return lx.errAt(lx.pos, "bad number %q", text)
		}
		lx.toks = append(lx.toks, token{t: tFloat, f: f, pos: lx.pos})
	} else {
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return lx.errAt(lx.pos, "bad integer %q", text)
		}
		lx.toks = append(lx.toks, token{t: tInt, n: n, pos: lx.pos})
	}
	lx.pos = q
	return nil
}

// lexString reads a quoted literal and decodes Python's unicode-escape sequences, as Jinja2
// does; unknown escapes stay as written.
func (lx *lexer) lexString(q byte) error {
	src := lx.src
	p := lx.pos + 1
	var b []byte
	for {
		if p >= len(src) {
			return lx.errAt(lx.pos, "unterminated string")
		}
		c := src[p]
		if c == q {
			p++
			break
		}
		if c != '\\' {
			b = append(b, c)
			p++
			continue
		}
		if p+1 >= len(src) {
			return lx.errAt(lx.pos, "unterminated string")
		}
		e := src[p+1]
		p += 2
		switch e {
		case '\n':
		case '\\', '\'', '"':
			b = append(b, e)
		case 'n':
			b = append(b, '\n')
		case 't':
			b = append(b, '\t')
		case 'r':
			b = append(b, '\r')
		case 'a':
			b = append(b, 7)
		case 'b':
			b = append(b, 8)
		case 'f':
			b = append(b, 12)
		case 'v':
			b = append(b, 11)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if p+n > len(src) {
				return lx.errAt(lx.pos, "truncated \\%c escape", e)
			}
			r, err := strconv.ParseUint(src[p:p+n], 16, 32)
			if err != nil {
				return lx.errAt(lx.pos, "bad \\%c escape", e)
			}
			b = utf8.AppendRune(b, rune(r))
			p += n
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(e - '0')
			for k := 0; k < 2 && p < len(src) && src[p] >= '0' && src[p] <= '7'; k++ {
				v = v*8 + int(src[p]-'0')
				p++
			}
			b = utf8.AppendRune(b, rune(v))
		default:
			b = append(b, '\\', e)
		}
	}
	lx.toks = append(lx.toks, token{t: tString, s: string(b), pos: lx.pos})
	lx.pos = p
	return nil
}
