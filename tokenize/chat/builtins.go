package chat

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// Python's str.upper/lower use full Unicode case mappings ("ß".upper() == "SS"). A Caser
// keeps state, so each non-ASCII call makes its own.

func toUpper(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return cases.Upper(language.Und).String(s)
		}
	}
	return strings.ToUpper(s)
}

func toLower(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return cases.Lower(language.Und).String(s)
		}
	}
	return strings.ToLower(s)
}

func isDictMethod(name string) bool {
	switch name {
	case "items", "keys", "values", "get", "copy", "pop", "popitem", "setdefault", "update", "clear":
		return true
	}
	return false
}

func isMutatingListMethod(name string) bool {
	switch name {
	case "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear":
		return true
	}
	return false
}

func isStrMethod(name string) bool {
	switch name {
	case "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "lower", "upper",
		"replace", "title", "capitalize", "join", "count", "find", "rfind", "index", "splitlines",
		"isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "format", "removeprefix",
		"removesuffix", "zfill", "swapcase", "casefold", "partition", "rpartition":
		return true
	}
	return false
}

func argOr(args []Value, kw []kwArg, i int, name string, def Value) Value {
	if i < len(args) {
		return args[i]
	}
	for _, k := range kw {
		if k.name == name {
			return k.v
		}
	}
	return def
}

func (r *renderer) callMethod(self Value, name string, args []Value, kw []kwArg, pos int) (Value, error) {
	switch self.k {
	case kDict:
		switch name {
		case "items":
			items := make([]Value, len(self.dct().keys))
			for i, k := range self.dct().keys {
				items[i] = tupleOf(strVal(k), self.dct().vals[i])
			}
			return listOf(items), nil
		case "keys":
			items := make([]Value, len(self.dct().keys))
			for i, k := range self.dct().keys {
				items[i] = strVal(k)
			}
			return listOf(items), nil
		case "values":
			return listOf(append([]Value(nil), self.dct().vals...)), nil
		case "get":
			if len(args) == 0 {
				return undefined, r.errf(pos, "get expected at least 1 argument")
			}
			def := argOr(args, nil, 1, "", none)
			if args[0].k == kString {
				if v, ok := self.dct().get(args[0].s); ok {
					return v, nil
				}
			}
			return def, nil
		case "copy":
			d := r.a.dict(len(self.dct().keys))
			for i, k := range self.dct().keys {
				d.set(k, self.dct().vals[i])
			}
			return dictValue(d), nil
		}
		return undefined, r.errf(pos, "access to attribute '%s' of 'dict' object is unsafe", name)
	case kList:
		switch name {
		case "index":
			if len(args) > 0 {
				for i, it := range self.lst().items {
					if equal(it, args[0]) {
						return intVal(int64(i)), nil
					}
				}
			}
			return undefined, r.errf(pos, "value is not in list")
		case "count":
			n := 0
			if len(args) > 0 {
				for _, it := range self.lst().items {
					if equal(it, args[0]) {
						n++
					}
				}
			}
			return intVal(int64(n)), nil
		}
		return undefined, r.errf(pos, "access to attribute '%s' of '%s' object is unsafe", name, self.typeName())
	case kString:
		return r.strMethod(self.s, name, args, kw, pos)
	}
	return undefined, r.errf(pos, "'%s' object has no attribute '%s'", self.typeName(), name)
}

func strArg(r *renderer, v Value, pos int, what string) (string, error) {
	if v.k != kString {
		return "", r.errf(pos, "%s must be str, not %s", what, v.typeName())
	}
	return v.s, nil
}

func (r *renderer) strMethod(s, name string, args []Value, kw []kwArg, pos int) (Value, error) {
	switch name {
	case "startswith", "endswith":
		if len(args) == 0 {
			return undefined, r.errf(pos, "%s takes at least 1 argument", name)
		}
		test := strings.HasPrefix
		if name == "endswith" {
			test = strings.HasSuffix
		}
		cands := args[:1]
		if args[0].k == kList && args[0].lst().isTuple {
			cands = args[0].lst().items
		}
		for _, c := range cands {
			if c.k != kString {
				return undefined, r.errf(pos, "%s argument must be str, not %s", name, c.typeName())
			}
			cs := c.s
			if test(s, cs) {
				return vTrue, nil
			}
		}
		return vFalse, nil
	case "strip", "lstrip", "rstrip":
		left, right := name != "rstrip", name != "lstrip"
		chars := argOr(args, kw, 0, "chars", none)
		if chars.k == kNone {
			return strVal(pyStrip(s, left, right)), nil
		}
		cs, err := strArg(r, chars, pos, name+" arg")
		if err != nil {
			return undefined, err
		}
		return strVal(pyStripChars(s, cs, left, right)), nil
	case "split", "rsplit":
		sep := argOr(args, kw, 0, "sep", none)
		maxv := argOr(args, kw, 1, "maxsplit", intVal(-1))
		max := int(maxv.n)
		var parts []string
		if sep.k == kNone {
			parts = pyWhitespaceSplit(s, max, name == "rsplit")
		} else {
			ss, err := strArg(r, sep, pos, "separator")
			if err != nil {
				return undefined, err
			}
			if ss == "" {
				return undefined, r.errf(pos, "empty separator")
			}
			if max < 0 {
				parts = strings.Split(s, ss)
			} else if name == "split" {
				parts = strings.SplitN(s, ss, max+1)
			} else {
				parts = rsplitN(s, ss, max)
			}
		}
		items := make([]Value, len(parts))
		for i, p := range parts {
			items[i] = strVal(p)
		}
		return listOf(items), nil
	case "splitlines":
		keep := argOr(args, kw, 0, "keepends", vFalse).truth()
		var items []Value
		for len(s) > 0 {
			i := 0
			for i < len(s) {
				c, n := utf8.DecodeRuneInString(s[i:])
				if isLineBreak(c) {
					end := i + n
					if c == '\r' && end < len(s) && s[end] == '\n' {
						end++
					}
					if keep {
						items = append(items, strVal(s[:end]))
					} else {
						items = append(items, strVal(s[:i]))
					}
					s = s[end:]
					i = -1
					break
				}
				i += n
			}
			if i >= 0 {
				items = append(items, strVal(s))
				break
			}
		}
		return listOf(items), nil
	case "lower", "casefold":
		return strVal(toLower(s)), nil
	case "upper":
		return strVal(toUpper(s)), nil
	case "swapcase":
		return strVal(strings.Map(func(c rune) rune {
			if unicode.IsUpper(c) {
				return unicode.ToLower(c)
			}
			return unicode.ToUpper(c)
		}, s)), nil
	case "title":
		return strVal(pyTitle(s)), nil
	case "capitalize":
		return strVal(pyCapitalize(s)), nil
	case "replace":
		if len(args) < 2 {
			return undefined, r.errf(pos, "replace expected 2 arguments")
		}
		old, err := strArg(r, args[0], pos, "replace argument 1")
		if err != nil {
			return undefined, err
		}
		nw, err := strArg(r, args[1], pos, "replace argument 2")
		if err != nil {
			return undefined, err
		}
		n := -1
		if len(args) > 2 {
			n = int(args[2].n)
		}
		return strVal(strings.Replace(s, old, nw, n)), nil
	case "join":
		if len(args) == 0 {
			return undefined, r.errf(pos, "join takes 1 argument")
		}
		items, err := r.iterate(args[0], pos)
		if err != nil {
			return undefined, err
		}
		var b strings.Builder
		for i, it := range items {
			if it.k != kString {
				return undefined, r.errf(pos, "sequence item %d: expected str instance, %s found", i, it.typeName())
			}
			if i > 0 {
				b.WriteString(s)
			}
			b.WriteString(it.s)
		}
		return strVal(b.String()), nil
	case "count":
		sub, err := strArg(r, argOr(args, kw, 0, "x", undefined), pos, "count argument")
		if err != nil {
			return undefined, err
		}
		if sub == "" {
			return intVal(int64(runeLen(s) + 1)), nil
		}
		return intVal(int64(strings.Count(s, sub))), nil
	case "find", "rfind", "index":
		sub, err := strArg(r, argOr(args, kw, 0, "sub", undefined), pos, name+" argument")
		if err != nil {
			return undefined, err
		}
		i := strings.Index(s, sub)
		if name == "rfind" {
			i = strings.LastIndex(s, sub)
		}
		if i < 0 {
			if name == "index" {
				return undefined, r.errf(pos, "substring not found")
			}
			return intVal(-1), nil
		}
		return intVal(int64(utf8.RuneCountInString(s[:i]))), nil
	case "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper":
		return boolVal(strPredicate(s, name)), nil
	case "removeprefix":
		p, err := strArg(r, argOr(args, kw, 0, "prefix", undefined), pos, "prefix")
		if err != nil {
			return undefined, err
		}
		return strVal(strings.TrimPrefix(s, p)), nil
	case "removesuffix":
		p, err := strArg(r, argOr(args, kw, 0, "suffix", undefined), pos, "suffix")
		if err != nil {
			return undefined, err
		}
		return strVal(strings.TrimSuffix(s, p)), nil
	case "zfill":
		w64 := argOr(args, kw, 0, "width", intVal(0)).n
		if w64 > maxOutput {
			return undefined, r.errf(pos, "zfill width %d larger than %d bytes", w64, maxOutput)
		}
		w := int(w64)
		n := runeLen(s)
		if n >= w {
			return strVal(s), nil
		}
		sign := ""
		if s != "" && (s[0] == '+' || s[0] == '-') {
			sign, s = s[:1], s[1:]
		}
		return strVal(sign + strings.Repeat("0", w-n) + s), nil
	case "partition", "rpartition":
		sep, err := strArg(r, argOr(args, kw, 0, "sep", undefined), pos, "sep")
		if err != nil {
			return undefined, err
		}
		i := strings.Index(s, sep)
		if name == "rpartition" {
			i = strings.LastIndex(s, sep)
		}
		if i < 0 {
			if name == "rpartition" {
				return tupleOf(emptyStr, emptyStr, strVal(s)), nil
			}
			return tupleOf(strVal(s), emptyStr, emptyStr), nil
		}
		return tupleOf(strVal(s[:i]), strVal(sep), strVal(s[i+len(sep):])), nil
	case "format":
		out, err := pyStrFormat(s, args, kw)
		if err != nil {
			return undefined, r.errf(pos, "%v", err)
		}
		return strVal(out), nil
	}
	return undefined, r.errf(pos, "'str' object has no attribute '%s'", name)
}

func isLineBreak(c rune) bool {
	switch c {
	case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
		return true
	}
	return false
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, c := range s {
		switch name {
		case "isdigit":
			if !unicode.IsDigit(c) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(c) {
				return false
			}
		case "isalnum":
			if !unicode.IsLetter(c) && !unicode.IsDigit(c) && !unicode.IsNumber(c) {
				return false
			}
		case "isspace":
			if !isPySpace(c) {
				return false
			}
		case "islower":
			if unicode.IsUpper(c) || unicode.IsTitle(c) {
				return false
			}
			cased = cased || unicode.IsLower(c)
		case "isupper":
			if unicode.IsLower(c) || unicode.IsTitle(c) {
				return false
			}
			cased = cased || unicode.IsUpper(c)
		}
	}
	if name == "islower" || name == "isupper" {
		return cased
	}
	return true
}

// pyWhitespaceSplit is str.split() / str.rsplit() with no separator.
func pyWhitespaceSplit(s string, max int, fromRight bool) []string {
	if !fromRight {
		var out []string
		for {
			s = pyStrip(s, true, false)
			if s == "" {
				return out
			}
			if max >= 0 && len(out) == max {
				return append(out, s)
			}
			i := 0
			for i < len(s) {
				c, n := utf8.DecodeRuneInString(s[i:])
				if isPySpace(c) {
					break
				}
				i += n
			}
			out = append(out, s[:i])
			s = s[i:]
		}
	}
	var rev []string
	for {
		s = pyStrip(s, false, true)
		if s == "" {
			break
		}
		if max >= 0 && len(rev) == max {
			rev = append(rev, s)
			break
		}
		i := len(s)
		for i > 0 {
			c, n := utf8.DecodeLastRuneInString(s[:i])
			if isPySpace(c) {
				break
			}
			i -= n
		}
		rev = append(rev, s[i:])
		s = s[:i]
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

func rsplitN(s, sep string, max int) []string {
	var rev []string
	for len(rev) < max {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
	}
	rev = append(rev, s)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

// Per-rune full case mappings ("ß" title-cases to "Ss", upper-cases to "SS").
func titleRune(b *strings.Builder, c rune) {
	if c < utf8.RuneSelf {
		b.WriteRune(unicode.ToUpper(c))
		return
	}
	b.WriteString(cases.Title(language.Und, cases.NoLower).String(string(c)))
}

func upperRune(b *strings.Builder, c rune) {
	if c < utf8.RuneSelf {
		b.WriteRune(unicode.ToUpper(c))
		return
	}
	b.WriteString(toUpper(string(c)))
}

func lowerRune(b *strings.Builder, c rune) {
	if c < utf8.RuneSelf {
		b.WriteRune(unicode.ToLower(c))
		return
	}
	b.WriteString(toLower(string(c)))
}

// pyCapitalize is str.capitalize(): the first character title-cased, the rest lower-cased.
func pyCapitalize(s string) string {
	if s == "" {
		return s
	}
	c, n := utf8.DecodeRuneInString(s)
	var b strings.Builder
	titleRune(&b, c)
	b.WriteString(toLower(s[n:]))
	return b.String()
}

// pyTitle is str.title(): a cased character after an uncased one starts a word.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, c := range s {
		if prevCased {
			lowerRune(&b, c)
		} else {
			titleRune(&b, c)
		}
		prevCased = unicode.IsUpper(c) || unicode.IsLower(c) || unicode.IsTitle(c)
	}
	return b.String()
}

// jinjaTitle is Jinja2's title filter: each word (split after whitespace, "-", "(", "{", "[",
// "<") gets its first character upper-cased and the rest lower-cased.
func jinjaTitle(s string) string {
	var b strings.Builder
	start := true
	for _, c := range s {
		sep := isPySpace(c) || strings.ContainsRune("-({[<", c)
		switch {
		case sep:
			b.WriteRune(c)
		case start:
			upperRune(&b, c)
		default:
			lowerRune(&b, c)
		}
		start = sep
	}
	return b.String()
}

// pyStrFormat handles the str.format forms templates use: {}, {0}, {name}, with no format spec
// beyond what str() gives.
func pyStrFormat(s string, args []Value, kw []kwArg) (string, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '{' {
			if i+1 < len(s) && s[i+1] == '{' {
				b.WriteByte('{')
				i++
				continue
			}
			j := strings.IndexByte(s[i:], '}')
			if j < 0 {
				return "", fmt.Errorf("single '{' encountered in format string")
			}
			field := s[i+1 : i+j]
			if strings.ContainsAny(field, ":!.[") {
				return "", fmt.Errorf("format spec %q is not supported", field)
			}
			var v Value
			switch {
			case field == "":
				if auto >= len(args) {
					return "", fmt.Errorf("replacement index %d out of range", auto)
				}
				v = args[auto]
				auto++
			case field[0] >= '0' && field[0] <= '9':
				n, err := strconv.Atoi(field)
				if err != nil || n >= len(args) {
					return "", fmt.Errorf("replacement index %s out of range", field)
				}
				v = args[n]
			default:
				found := false
				for _, k := range kw {
					if k.name == field {
						v, found = k.v, true
					}
				}
				if !found {
					return "", fmt.Errorf("KeyError: '%s'", field)
				}
			}
			b.Write(appendStr(nil, v))
			i += j
			continue
		}
		if c == '}' {
			if i+1 < len(s) && s[i+1] == '}' {
				i++
			}
			b.WriteByte('}')
			continue
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

// hashable is whether Python can hash the value (set members, dict keys).
func hashable(v Value) bool {
	switch v.k {
	case kList:
		if !v.lst().isTuple {
			return false
		}
		for _, it := range v.lst().items {
			if !hashable(it) {
				return false
			}
		}
		return true
	case kDict, kNS:
		return false
	}
	return true
}

// pyPercentFormat is "fmt" % args for %s, %d, %i, %r and %%.
func pyPercentFormat(f string, arg Value) (string, error) {
	args := []Value{arg}
	if arg.k == kList && arg.lst().isTuple {
		args = arg.lst().items
	}
	// A list or dict argument counts as a mapping: unused, it is no error.
	mapping := (arg.k == kList && !arg.lst().isTuple) || arg.k == kDict || arg.k == kUndefined
	var b []byte
	n := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			b = append(b, f[i])
			continue
		}
		i++
		if i >= len(f) {
			return "", fmt.Errorf("incomplete format")
		}
		if f[i] == '%' {
			b = append(b, '%')
			continue
		}
		if n >= len(args) {
			return "", fmt.Errorf("not enough arguments for format string")
		}
		v := args[n]
		n++
		switch f[i] {
		case 's':
			b = appendStr(b, v)
		case 'r':
			b = appendRepr(b, v)
		case 'd', 'i':
			if !v.isNumber() {
				return "", fmt.Errorf("%%d format: a real number is required, not %s", v.typeName())
			}
			if v.k == kFloat {
				b = strconv.AppendInt(b, int64(v.float()), 10)
			} else {
				b = strconv.AppendInt(b, v.n, 10)
			}
		default:
			return "", fmt.Errorf("unsupported format character '%c'", f[i])
		}
	}
	if n < len(args) && !(mapping && n == 0) {
		return "", fmt.Errorf("not all arguments converted during string formatting")
	}
	return string(b), nil
}

// Globals.

func globalFunc(name string, fn func(r *renderer, args []Value, kw []kwArg) (Value, error)) Value {
	return Value{k: kFunc, p: unsafe.Pointer(&object{name: name, fn: fn})}
}

var (
	gRange = globalFunc("range", func(r *renderer, args []Value, kw []kwArg) (Value, error) {
		var start, stop, step int64 = 0, 0, 1
		for _, a := range args {
			if a.k != kInt && a.k != kBool {
				return undefined, r.errf(-1, "range() integer argument expected, got %s", a.typeName())
			}
		}
		switch len(args) {
		case 1:
			stop = args[0].n
		case 2:
			start, stop = args[0].n, args[1].n
		case 3:
			start, stop, step = args[0].n, args[1].n, args[2].n
		default:
			return undefined, r.errf(-1, "range expected 1 to 3 arguments, got %d", len(args))
		}
		if step == 0 {
			return undefined, r.errf(-1, "range() arg 3 must not be zero")
		}
		var items []Value
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			if len(items) >= maxRange {
				return undefined, r.errf(-1, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", maxRange)
			}
			items = append(items, intVal(i))
		}
		return listOf(items), nil
	})
	gNamespace = globalFunc("namespace", func(r *renderer, args []Value, kw []kwArg) (Value, error) {
		d := r.a.dict(len(kw))
		for _, a := range args {
			if a.k != kDict {
				return undefined, r.errf(-1, "namespace() positional argument must be a dict")
			}
			for i, k := range a.dct().keys {
				d.set(k, a.dct().vals[i])
			}
		}
		for _, k := range kw {
			d.set(k.name, k.v)
		}
		return Value{k: kNS, p: unsafe.Pointer(d)}, nil
	})
	gDict = globalFunc("dict", func(r *renderer, args []Value, kw []kwArg) (Value, error) {
		d := r.a.dict(len(kw))
		for _, a := range args {
			if a.k != kDict {
				return undefined, r.errf(-1, "dict() positional argument must be a dict")
			}
			for i, k := range a.dct().keys {
				d.set(k, a.dct().vals[i])
			}
		}
		for _, k := range kw {
			d.set(k.name, k.v)
		}
		return dictValue(d), nil
	})
	gRaise = globalFunc("raise_exception", func(r *renderer, args []Value, kw []kwArg) (Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = toStr(args[0])
		}
		// The message may live in the render's arena; the error outlives it.
		return undefined, &RenderError{Msg: strings.Clone(msg)}
	})
	gStrftime = globalFunc("strftime_now", func(r *renderer, args []Value, kw []kwArg) (Value, error) {
		if len(args) != 1 || args[0].k != kString {
			return undefined, r.errf(-1, "strftime_now expects one format string")
		}
		if r.now.IsZero() {
			r.now = time.Now() // once per render: every call in it sees the same time
		}
		s, err := strftime(r.now, args[0].s)
		if err != nil {
			return undefined, r.errf(-1, "%v", err)
		}
		return strVal(s), nil
	})
)

var (
	monthNames = [...]string{"January", "February", "March", "April", "May", "June", "July",
		"August", "September", "October", "November", "December"}
	dayNames = [...]string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}
)

// strftime implements the C-locale directives of Python's datetime.strftime.
func strftime(t time.Time, f string) (string, error) {
	var b []byte
	pad := func(v, w int) { b = append(b, fmt.Sprintf("%0*d", w, v)...) }
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b = append(b, f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			pad(t.Day(), 2)
		case 'm':
			pad(int(t.Month()), 2)
		case 'Y':
			pad(t.Year(), 4)
		case 'y':
			pad(t.Year()%100, 2)
		case 'H':
			pad(t.Hour(), 2)
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			pad(h, 2)
		case 'M':
			pad(t.Minute(), 2)
		case 'S':
			pad(t.Second(), 2)
		case 'f':
			pad(t.Nanosecond()/1000, 6)
		case 'p':
			if t.Hour() < 12 {
				b = append(b, "AM"...)
			} else {
				b = append(b, "PM"...)
			}
		case 'B':
			b = append(b, monthNames[t.Month()-1]...)
		case 'b', 'h':
			b = append(b, monthNames[t.Month()-1][:3]...)
		case 'A':
			b = append(b, dayNames[t.Weekday()]...)
		case 'a':
			b = append(b, dayNames[t.Weekday()][:3]...)
		case 'j':
			pad(t.YearDay(), 3)
		case 'w':
			pad(int(t.Weekday()), 1)
		case 'e':
			b = append(b, fmt.Sprintf("%2d", t.Day())...)
		case '-':
			if i+1 < len(f) {
				i++
				switch f[i] {
				case 'd':
					pad(t.Day(), 1)
				case 'm':
					pad(int(t.Month()), 1)
				case 'H':
					pad(t.Hour(), 1)
				case 'I':
					h := t.Hour() % 12
					if h == 0 {
						h = 12
					}
					pad(h, 1)
				case 'M':
					pad(t.Minute(), 1)
				case 'j':
					pad(t.YearDay(), 1)
				default:
					return "", fmt.Errorf("unsupported strftime directive %%-%c", f[i])
				}
			}
		case '%':
			b = append(b, '%')
		default:
			return "", fmt.Errorf("unsupported strftime directive %%%c", f[i])
		}
	}
	return string(b), nil
}

// Tests.

func (r *renderer) applyTest(e *expr, v Value) (bool, error) {
	var argBuf [2]Value
	args := argBuf[:0]
	for _, a := range e.args {
		x, err := r.eval(a)
		if err != nil {
			return false, err
		}
		args = append(args, x)
	}
	arg := func() (Value, error) {
		if len(args) == 0 {
			return undefined, r.errf(e.pos, "test '%s' needs an argument", e.name)
		}
		return args[0], nil
	}
	switch e.name {
	case "defined":
		return v.k != kUndefined, nil
	case "undefined":
		return v.k == kUndefined, nil
	case "none":
		return v.k == kNone, nil
	case "true":
		return v.k == kBool && v.n != 0, nil
	case "false":
		return v.k == kBool && v.n == 0, nil
	case "boolean":
		return v.k == kBool, nil
	case "string":
		return v.k == kString, nil
	case "number":
		return v.k == kInt || v.k == kFloat || v.k == kBool, nil
	case "integer":
		return v.k == kInt, nil
	case "float":
		return v.k == kFloat, nil
	case "mapping":
		return v.k == kDict, nil
	case "sequence":
		return v.k == kList || v.k == kString || v.k == kDict || v.k == kUndefined, nil
	case "iterable":
		return v.k == kList || v.k == kString || v.k == kDict || v.k == kNS || v.k == kUndefined, nil
	case "callable":
		return v.k == kFunc || v.k == kCycle, nil
	case "odd", "even":
		// Jinja2: value % 2 == 1 (odd) or == 0 (even); floats allowed.
		m, err := r.binop("%", v, intVal(2), e.pos)
		if err != nil {
			return false, err
		}
		want := int64(0)
		if e.name == "odd" {
			want = 1
		}
		return equal(m, intVal(want)), nil
	case "divisibleby":
		a, err := arg()
		if err != nil {
			return false, err
		}
		m, err := r.binop("%", v, a, e.pos)
		if err != nil {
			return false, err
		}
		return !m.truth(), nil
	case "lower":
		return v.k == kString && v.s == toLower(v.s), nil
	case "upper":
		return v.k == kString && v.s == toUpper(v.s), nil
	case "eq", "equalto", "==":
		a, err := arg()
		return err == nil && equal(v, a), err
	case "ne", "!=":
		a, err := arg()
		return err == nil && !equal(v, a), err
	case "lt", "lessthan", "<", "gt", "greaterthan", ">", "le", "<=", "ge", ">=":
		a, err := arg()
		if err != nil {
			return false, err
		}
		op := map[string]string{"lt": "<", "lessthan": "<", "gt": ">", "greaterthan": ">", "le": "<=", "ge": ">="}[e.name]
		if op == "" {
			op = e.name
		}
		return r.compare(op, v, a, e.pos)
	case "in":
		a, err := arg()
		if err != nil {
			return false, err
		}
		return r.contains(a, v, e.pos)
	case "sameas":
		a, err := arg()
		if err != nil {
			return false, err
		}
		switch v.k {
		case kNone, kBool, kUndefined:
			return v.k == a.k && v.n == a.n, nil
		case kList:
			return a.k == kList && a.p == v.p, nil
		case kDict, kNS:
			return a.k == v.k && a.p == v.p, nil
		}
		return false, nil
	}
	return false, r.errf(e.pos, "no test named '%s'", e.name)
}

// Filters.

func (r *renderer) applyFilter(e *expr, v Value) (Value, error) {
	var argBuf [3]Value
	args := argBuf[:0]
	for _, a := range e.args {
		x, err := r.eval(a)
		if err != nil {
			return undefined, err
		}
		args = append(args, x)
	}
	var kw []kwArg
	for _, k := range e.kw {
		x, err := r.eval(k.e)
		if err != nil {
			return undefined, err
		}
		kw = append(kw, kwArg{k.name, x})
	}
	return r.filter(e.name, v, args, kw, e.pos)
}

func (r *renderer) filter(name string, v Value, args []Value, kw []kwArg, pos int) (Value, error) {
	switch name {
	case "tojson":
		return r.toJSON(v, args, kw, pos)
	case "safe", "string":
		if name == "string" || v.k != kString {
			return strVal(toStr(v)), nil
		}
		return v, nil
	case "length", "count":
		switch v.k {
		case kString:
			return intVal(int64(runeLen(v.s))), nil
		case kList:
			return intVal(int64(len(v.lst().items))), nil
		case kDict, kNS:
			return intVal(int64(len(v.dct().keys))), nil
		case kUndefined:
			return intVal(0), nil
		}
		return undefined, r.errf(pos, "object of type '%s' has no len()", v.typeName())
	case "trim":
		s := toStr(v)
		chars := argOr(args, kw, 0, "chars", none)
		if chars.k == kString {
			return strVal(pyStripChars(s, chars.s, true, true)), nil
		}
		return strVal(pyStrip(s, true, true)), nil
	case "upper":
		return strVal(toUpper(toStr(v))), nil
	case "lower":
		return strVal(toLower(toStr(v))), nil
	case "capitalize":
		return strVal(pyCapitalize(toStr(v))), nil
	case "title":
		return strVal(jinjaTitle(toStr(v))), nil
	case "default", "d":
		def := argOr(args, kw, 0, "default_value", emptyStr)
		boolean := argOr(args, kw, 1, "boolean", vFalse).truth()
		if v.k == kUndefined || (boolean && !v.truth()) {
			return def, nil
		}
		return v, nil
	case "replace":
		if len(args) < 2 {
			return undefined, r.errf(pos, "replace filter needs 2 arguments")
		}
		n := -1
		if c := argOr(args, kw, 2, "count", none); c.k == kInt {
			n = int(c.n)
		}
		return strVal(strings.Replace(toStr(v), toStr(args[0]), toStr(args[1]), n)), nil
	case "join":
		sep := toStr(argOr(args, kw, 0, "d", emptyStr))
		attr := argOr(args, kw, 1, "attribute", none)
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		var b []byte
		for i, it := range items {
			if attr.k != kNone {
				if it, err = r.attrPath(it, attr, pos); err != nil {
					return undefined, err
				}
			}
			if i > 0 {
				b = append(b, sep...)
			}
			b = appendStr(b, it)
		}
		return strVal(string(b)), nil
	case "first", "last":
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		if len(items) == 0 {
			return undefined, nil
		}
		if name == "first" {
			return items[0], nil
		}
		return items[len(items)-1], nil
	case "list":
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		return listOf(append([]Value(nil), items...)), nil
	case "reverse":
		if v.k == kString {
			rs := []rune(v.s)
			for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
				rs[i], rs[j] = rs[j], rs[i]
			}
			return strVal(string(rs)), nil
		}
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		out := make([]Value, len(items))
		for i, it := range items {
			out[len(items)-1-i] = it
		}
		return listOf(out), nil
	case "items":
		if v.k == kUndefined {
			return listOf(nil), nil
		}
		if v.k != kDict {
			return undefined, r.errf(pos, "Can only get item pairs from a mapping.")
		}
		return r.callMethod(v, "items", nil, nil, pos)
	case "dictsort":
		if v.k != kDict {
			return undefined, r.errf(pos, "dictsort needs a mapping")
		}
		caseSens := argOr(args, kw, 0, "case_sensitive", vFalse).truth()
		byVal := argOr(args, kw, 1, "by", strVal("key")).s == "value"
		rev := argOr(args, kw, 2, "reverse", vFalse).truth()
		pairs, _ := r.callMethod(v, "items", nil, nil, pos)
		items := pairs.lst().items
		err := r.sortValues(items, func(x Value) (Value, error) {
			k := x.lst().items[0]
			if byVal {
				k = x.lst().items[1]
			}
			if !caseSens && k.k == kString {
				k = strVal(toLower(k.s))
			}
			return k, nil
		}, rev, pos)
		return pairs, err
	case "sort":
		rev := argOr(args, kw, 0, "reverse", vFalse).truth()
		caseSens := argOr(args, kw, 1, "case_sensitive", vFalse).truth()
		attr := argOr(args, kw, 2, "attribute", none)
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		out := append([]Value(nil), items...)
		err = r.sortValues(out, func(x Value) (Value, error) {
			if attr.k != kNone {
				var err error
				if x, err = r.attrPath(x, attr, pos); err != nil {
					return undefined, err
				}
			}
			if !caseSens && x.k == kString {
				x = strVal(toLower(x.s))
			}
			return x, nil
		}, rev, pos)
		return listOf(out), err
	case "unique":
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		var out []Value
		for _, it := range items {
			if !hashable(it) {
				return undefined, r.errf(pos, "unhashable type: '%s'", it.typeName())
			}
			dup := false
			for _, o := range out {
				a, b := it, o
				if a.k == kString && b.k == kString {
					a, b = strVal(toLower(a.s)), strVal(toLower(b.s))
				}
				if equal(a, b) {
					dup = true
					break
				}
			}
			if !dup {
				out = append(out, it)
			}
		}
		return listOf(out), nil
	case "selectattr", "rejectattr", "select", "reject":
		return r.selectFilter(name, v, args, kw, pos)
	case "map":
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		out := make([]Value, 0, len(items))
		if attr := argOr(nil, kw, 0, "attribute", none); attr.k != kNone {
			def := argOr(nil, kw, 0, "default", undefined)
			for _, it := range items {
				x, err := r.attrPath(it, attr, pos)
				if err != nil {
					return undefined, err
				}
				if x.k == kUndefined && def.k != kUndefined {
					x = def
				}
				out = append(out, x)
			}
			return listOf(out), nil
		}
		if len(args) == 0 || args[0].k != kString {
			return undefined, r.errf(pos, "map needs a filter name or attribute=")
		}
		for _, it := range items {
			x, err := r.filter(args[0].s, it, args[1:], kw, pos)
			if err != nil {
				return undefined, err
			}
			out = append(out, x)
		}
		return listOf(out), nil
	case "int":
		def := argOr(args, kw, 0, "default", intVal(0))
		switch v.k {
		case kUndefined:
			return undefined, r.undefinedErr(v, pos) // int(Undefined) raises
		case kInt, kBool:
			return intVal(v.n), nil
		case kFloat:
			return intVal(int64(v.float())), nil
		case kString:
			if n, err := strconv.ParseInt(strings.TrimSpace(strings.ReplaceAll(v.s, "_", "")), 10, 64); err == nil {
				return intVal(n), nil
			}
			if f, err := strconv.ParseFloat(strings.TrimSpace(v.s), 64); err == nil {
				return intVal(int64(f)), nil
			}
		}
		return def, nil
	case "float":
		def := argOr(args, kw, 0, "default", floatVal(0))
		switch v.k {
		case kUndefined:
			return undefined, r.undefinedErr(v, pos)
		case kInt, kBool, kFloat:
			return floatVal(v.num()), nil
		case kString:
			if f, err := strconv.ParseFloat(strings.TrimSpace(v.s), 64); err == nil {
				return floatVal(f), nil
			}
		}
		return def, nil
	case "abs":
		switch v.k {
		case kInt, kBool:
			if v.n < 0 {
				return intVal(-v.n), nil
			}
			return intVal(v.n), nil
		case kFloat:
			return floatVal(math.Abs(v.float())), nil
		}
		return undefined, r.errf(pos, "bad operand type for abs(): '%s'", v.typeName())
	case "round":
		prec := int(argOr(args, kw, 0, "precision", intVal(0)).n)
		method := argOr(args, kw, 1, "method", strVal("common")).s
		if !v.isNumber() {
			return undefined, r.errf(pos, "round needs a number")
		}
		if v.k != kFloat && method != "ceil" && method != "floor" && prec >= 0 {
			return intVal(v.n), nil // Python's round(int, n) is the int itself
		}
		m := math.Pow(10, float64(prec))
		x := v.num() * m
		switch method {
		case "ceil":
			x = math.Ceil(x)
		case "floor":
			x = math.Floor(x)
		default:
			if prec >= 0 {
				// Python's round() rounds the exact binary value, half to even, like
				// strconv's correctly rounded formatting.
				f, _ := strconv.ParseFloat(strconv.FormatFloat(v.num(), 'f', prec, 64), 64)
				return floatVal(f), nil
			}
			x = math.RoundToEven(x)
		}
		return floatVal(x / m), nil
	case "sum":
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		attr := argOr(args, kw, 0, "attribute", none)
		acc := argOr(args, kw, 1, "start", intVal(0))
		for _, it := range items {
			if attr.k != kNone {
				if it, err = r.attrPath(it, attr, pos); err != nil {
					return undefined, err
				}
			}
			if acc, err = r.binop("+", acc, it, pos); err != nil {
				return undefined, err
			}
		}
		return acc, nil
	case "min", "max":
		items, err := r.iterate(v, pos)
		if err != nil {
			return undefined, err
		}
		if len(items) == 0 {
			return undefined, nil
		}
		best := items[0]
		for _, it := range items[1:] {
			a, b := it, best
			if a.k == kString && b.k == kString {
				a, b = strVal(toLower(a.s)), strVal(toLower(b.s))
			}
			lt, ok := less(a, b)
			if !ok {
				return undefined, r.errf(pos, "values do not order")
			}
			gt, _ := less(b, a)
			if (name == "min" && lt) || (name == "max" && gt) {
				best = it
			}
		}
		return best, nil
	case "attr":
		if len(args) == 0 || args[0].k != kString {
			return undefined, r.errf(pos, "attr needs a name")
		}
		return r.getAttr(v, args[0].s, pos)
	case "indent":
		width := argOr(args, kw, 0, "width", intVal(4))
		first := argOr(args, kw, 1, "first", vFalse).truth()
		blank := argOr(args, kw, 2, "blank", vFalse).truth()
		if width.k != kString && width.n > maxOutput {
			return undefined, r.errf(pos, "indent width %d larger than %d bytes", width.n, maxOutput)
		}
		ind := strings.Repeat(" ", int(max(width.n, 0))) // Python: " " * -1 == ""
		if width.k == kString {
			ind = width.s
		}
		if v.k != kString { // Jinja2 appends "\n" to the value itself: only strings work
			if v.k == kUndefined {
				return undefined, r.undefinedErr(v, pos)
			}
			return undefined, r.errf(pos, "unsupported operand type(s) for +=: '%s' and 'str'", v.typeName())
		}
		s := v.s
		s += "\n" // Jinja2 appends a newline, indents, then strips it back off.
		lines := strings.SplitAfter(s, "\n")
		lines = lines[:len(lines)-1]
		var b strings.Builder
		for i, l := range lines {
			if i == 0 && !first {
				b.WriteString(l)
				continue
			}
			if !blank && strings.TrimRight(l, "\n") == "" || (!blank && pyStrip(l, true, true) == "") {
				b.WriteString(l)
				continue
			}
			b.WriteString(ind)
			b.WriteString(l)
		}
		return strVal(strings.TrimSuffix(b.String(), "\n")), nil
	case "wordcount":
		// Jinja2 counts matches of Python's \w+ (letters, numbers and "_").
		n, in := 0, false
		for _, c := range toStr(v) {
			w := c == '_' || unicode.IsLetter(c) || unicode.IsNumber(c)
			if w && !in {
				n++
			}
			in = w
		}
		return intVal(int64(n)), nil
	case "center":
		w64 := argOr(args, kw, 0, "width", intVal(80)).n
		if w64 > maxOutput {
			return undefined, r.errf(pos, "center width %d larger than %d bytes", w64, maxOutput)
		}
		w := int(w64)
		s := toStr(v)
		n := runeLen(s)
		if n >= w {
			return strVal(s), nil
		}
		left := (w - n) / 2
		if (w-n)%2 == 1 && w%2 == 1 {
			left++
		}
		return strVal(strings.Repeat(" ", left) + s + strings.Repeat(" ", w-n-left)), nil
	case "escape", "e", "forceescape":
		s := toStr(v)
		s = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\"", "&#34;", "'", "&#39;").Replace(s)
		return strVal(s), nil
	case "format":
		s := toStr(v)
		if len(args) == 1 {
			out, err := pyPercentFormat(s, args[0])
			if err != nil {
				return undefined, r.errf(pos, "%v", err)
			}
			return strVal(out), nil
		}
		out, err := pyPercentFormat(s, tupleOf(args...))
		if err != nil {
			return undefined, r.errf(pos, "%v", err)
		}
		return strVal(out), nil
	}
	return undefined, r.errf(pos, "no filter named '%s'", name)
}

// attrPath resolves Jinja's "a.b.0" attribute strings (and integer indices).
func (r *renderer) attrPath(v Value, attr Value, pos int) (Value, error) {
	if attr.k == kInt {
		return r.getItem(v, attr, pos)
	}
	for _, part := range strings.Split(toStr(attr), ".") {
		var key Value
		if n, err := strconv.ParseInt(part, 10, 64); err == nil {
			key = intVal(n)
		} else {
			key = strVal(part)
		}
		var err error
		if v, err = r.getItem(v, key, pos); err != nil {
			return undefined, err
		}
	}
	return v, nil
}

func (r *renderer) sortValues(items []Value, key func(Value) (Value, error), rev bool, pos int) error {
	keys := make([]Value, len(items))
	for i, it := range items {
		k, err := key(it)
		if err != nil {
			return err
		}
		keys[i] = k
	}
	idx := ident(len(items))
	var bad bool
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := keys[idx[a]], keys[idx[b]]
		if rev {
			x, y = y, x
		}
		lt, ok := less(x, y)
		if !ok {
			bad = true
		}
		return lt
	})
	if bad {
		return r.errf(pos, "values do not order")
	}
	sorted := make([]Value, len(items))
	for i, j := range idx {
		sorted[i] = items[j]
	}
	copy(items, sorted)
	return nil
}

func (r *renderer) selectFilter(name string, v Value, args []Value, kw []kwArg, pos int) (Value, error) {
	items, err := r.iterate(v, pos)
	if err != nil {
		return undefined, err
	}
	byAttr := name == "selectattr" || name == "rejectattr"
	want := name == "select" || name == "selectattr"
	rest := args
	var attr Value
	if byAttr {
		if len(rest) == 0 {
			return undefined, r.errf(pos, "%s needs an attribute name", name)
		}
		attr, rest = rest[0], rest[1:]
	}
	var out []Value
	for _, it := range items {
		x := it
		if byAttr {
			if x, err = r.attrPath(it, attr, pos); err != nil {
				return undefined, err
			}
		}
		ok := x.truth()
		if len(rest) > 0 {
			if rest[0].k != kString {
				return undefined, r.errf(pos, "%s test name must be a string", name)
			}
			te := &expr{op: eTest, name: rest[0].s, pos: pos}
			for _, a := range rest[1:] {
				te.args = append(te.args, &expr{op: eConst, val: a})
			}
			if ok, err = r.applyTest(te, x); err != nil {
				return undefined, err
			}
		}
		if ok == want {
			out = append(out, it)
		}
	}
	return listOf(out), nil
}

// appendToJSON writes {{ v | tojson(...) }} straight into dst.
func (r *renderer) appendToJSON(dst []byte, e *expr, v Value) ([]byte, error) {
	var argBuf [4]Value
	args := argBuf[:0]
	for _, a := range e.args {
		x, err := r.eval(a)
		if err != nil {
			return dst, err
		}
		args = append(args, x)
	}
	var kw []kwArg
	for _, k := range e.kw {
		x, err := r.eval(k.e)
		if err != nil {
			return dst, err
		}
		kw = append(kw, kwArg{k.name, x})
	}
	o, err := r.jsonOptions(args, kw)
	if err != nil {
		return dst, err
	}
	mark := len(dst)
	dst, err = appendJSON(dst, v, &o, 0)
	if err != nil {
		return dst[:mark], r.errf(e.pos, "%v", err)
	}
	return dst, nil
}

// toJSON is transformers' tojson filter: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys). Key order is insertion order unless sort_keys.
func (r *renderer) toJSON(v Value, args []Value, kw []kwArg, pos int) (Value, error) {
	o, err := r.jsonOptions(args, kw)
	if err != nil {
		return undefined, err
	}
	out, err := appendJSON(nil, v, &o, 0)
	if err != nil {
		return undefined, r.errf(pos, "%v", err)
	}
	return strVal(string(out)), nil
}

func (r *renderer) jsonOptions(args []Value, kw []kwArg) (jsonOpts, error) {
	o := defaultJSONOpts()
	if ea := argOr(args, kw, 0, "ensure_ascii", vFalse); ea.truth() {
		o.ensureASCII = true
	}
	ind := argOr(args, kw, 1, "indent", none)
	switch ind.k {
	case kInt, kBool:
		o.hasIndent = true
		if ind.n > maxOutput {
			return o, fmt.Errorf("tojson indent %d larger than %d bytes", ind.n, maxOutput)
		}
		o.indent = strings.Repeat(" ", int(max(ind.n, 0)))
	case kString:
		o.hasIndent = true
		o.indent = ind.s
	}
	if o.hasIndent {
		o.itemSep = ","
	}
	if sep := argOr(args, kw, 2, "separators", none); sep.k == kList && len(sep.lst().items) == 2 {
		o.itemSep, o.keySep = toStr(sep.lst().items[0]), toStr(sep.lst().items[1])
	}
	o.sortKeys = argOr(args, kw, 3, "sort_keys", vFalse).truth()
	return o, nil
}
