package openai

import "github.com/kvgate/kvgate/internal/jsonlex"

// Member finds key among the members of the JSON object v and returns the value's
// bounds relative to v; ok is false when v is not an object or lacks key. As Python's
// json (the engines' reader) does, escapes in member names are decoded and of a
// repeated member the last counts. It validates only what it walks.
func Member(v []byte, key string) (start, end int, ok bool) {
	i := jsonlex.SkipWS(v, 0)
	if i >= len(v) || v[i] != '{' {
		return 0, 0, false
	}
	i = jsonlex.SkipWS(v, i+1)
	if i < len(v) && v[i] == '}' {
		return 0, 0, false
	}
	for i < len(v) && v[i] == '"' {
		ke, esc, le := jsonlex.ScanString(v, i)
		if le != jsonlex.OK {
			return start, end, ok
		}
		match := keyIs(v[i:ke], esc, key)
		i = jsonlex.SkipWS(v, ke)
		if i >= len(v) || v[i] != ':' {
			return start, end, ok
		}
		vs := jsonlex.SkipWS(v, i+1)
		ve, err := skipValue(v, vs, 1)
		if err != nil {
			return start, end, ok
		}
		if match {
			start, end, ok = vs, ve, true
		}
		i = jsonlex.SkipWS(v, ve)
		if i >= len(v) || v[i] != ',' {
			return start, end, ok
		}
		i = jsonlex.SkipWS(v, i+1)
	}
	return start, end, ok
}

// keyIs says whether the member name k (quotes included; esc: it holds escapes) is key.
func keyIs(k []byte, esc bool, key string) bool {
	if !esc {
		return string(k[1:len(k)-1]) == key
	}
	// An escape decodes to at least one byte per six: a longer name is not key.
	if len(k)-2 > 6*len(key) || len(k) > maxEscKey {
		return false
	}
	var buf [maxEscKey]byte
	return string(jsonlex.AppendUnescaped(buf[:0], k[1:len(k)-1])) == key
}

// Path follows nested object keys from v and returns the value found, or nil.
func Path(v []byte, keys ...string) []byte {
	for _, k := range keys {
		s, e, ok := Member(v, k)
		if !ok {
			return nil
		}
		v = v[s:e]
	}
	return v
}

// Int parses a JSON integer value; ok is false for anything else (including null).
func Int(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	neg := false
	i := 0
	if v[0] == '-' {
		neg = true
		i = 1
	}
	if i >= len(v) {
		return 0, false
	}
	var n int64
	for ; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (1<<62)/10 {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// Elements calls fn with each element of the JSON array v until fn returns false.
func Elements(v []byte, fn func(elem []byte) bool) bool {
	i := jsonlex.SkipWS(v, 0)
	if i >= len(v) || v[i] != '[' {
		return false
	}
	i = jsonlex.SkipWS(v, i+1)
	if i < len(v) && v[i] == ']' {
		return true
	}
	for i < len(v) {
		e, err := skipValue(v, i, 1)
		if err != nil {
			return false
		}
		if !fn(v[i:e]) {
			return true
		}
		i = jsonlex.SkipWS(v, e)
		if i >= len(v) || v[i] != ',' {
			return i < len(v) && v[i] == ']'
		}
		i = jsonlex.SkipWS(v, i+1)
	}
	return false
}

// AppendTokens appends the integers of the JSON array v (a token-id prompt) to dst.
// For a batch ([[...],[...]]) it takes the first list. Values outside uint32 fail.
func AppendTokens(dst []uint32, v []byte) ([]uint32, bool) {
	i := jsonlex.SkipWS(v, 0)
	if i >= len(v) || v[i] != '[' {
		return dst, false
	}
	i = jsonlex.SkipWS(v, i+1)
	if i < len(v) && v[i] == '[' {
		e, err := skipValue(v, i, 1)
		if err != nil {
			return dst, false
		}
		return AppendTokens(dst, v[i:e])
	}
	for i < len(v) && v[i] != ']' {
		e, err := skipNumber(v, i)
		if err != nil {
			return dst, false
		}
		n, ok := Int(v[i:e])
		if !ok || n < 0 || n > 1<<32-1 {
			return dst, false
		}
		dst = append(dst, uint32(n))
		i = jsonlex.SkipWS(v, e)
		if i < len(v) && v[i] == ',' {
			i = jsonlex.SkipWS(v, i+1)
		}
	}
	return dst, true
}

// AppendUnquoted appends the decoded contents of the JSON string s (with quotes), which
// Scan validated, to dst. Invalid surrogates decode to U+FFFD, as Python's json does not
// but engines' tokenizers would see anyway; only routing depends on it.
func AppendUnquoted(dst []byte, s []byte) []byte {
	if len(s) < 2 {
		return dst
	}
	return jsonlex.AppendUnescaped(dst, s[1:len(s)-1])
}

// MessageContent returns the content of the first message with the given role in the
// JSON array messages: the raw string value (quotes included) or, for content parts,
// the first text part's string. nil when none.
func MessageContent(messages []byte, role string) []byte {
	var out []byte
	Elements(messages, func(m []byte) bool {
		rs, re, ok := Member(m, "role")
		if !ok || !quotedEq(m[rs:re], role) {
			return true
		}
		cs, ce, ok := Member(m, "content")
		if !ok {
			return true
		}
		c := m[cs:ce]
		if len(c) > 0 && c[0] == '"' {
			out = c
			return false
		}
		Elements(c, func(part []byte) bool {
			if t := Path(part, "text"); len(t) > 0 && t[0] == '"' {
				out = t
				return false
			}
			return true
		})
		return out == nil
	})
	return out
}

func quotedEq(q []byte, s string) bool {
	return len(q) == len(s)+2 && q[0] == '"' && string(q[1:len(q)-1]) == s
}

// AppendRewritten appends body to dst with the members drop removed and the raw
// members extra (`"k":v,...`, may be empty) inserted first. body must have been Scanned
// into r. Engines see the same object with those members replaced.
func AppendRewritten(dst, body []byte, r *Request, extra []byte, drop ...Field) []byte {
	var set uint64
	for _, f := range drop {
		set |= 1 << f
	}
	if r.dup&set != 0 {
		return appendRewrittenAll(dst, body, extra, set)
	}
	open := jsonlex.SkipWS(body, 0)
	close := len(body) - 1
	for close > open && body[close] != '}' {
		close--
	}
	var cuts [numFields][2]int
	n := 0
	for _, f := range drop {
		if m := r.Member[f]; m.Present() {
			cuts[n] = [2]int{int(m.Start), int(m.End)}
			n++
		}
	}
	for i := 1; i < n; i++ { // insertion sort: n is tiny
		for j := i; j > 0 && cuts[j][0] < cuts[j-1][0]; j-- {
			cuts[j], cuts[j-1] = cuts[j-1], cuts[j]
		}
	}
	m := 0 // cuts[:m] are final, merged and sorted
	for i := 0; i < n; i++ {
		s, e := cuts[i][0], cuts[i][1]
		k := jsonlex.SkipWS(body, e)
		if k < close && body[k] == ',' {
			e = k + 1
		} else {
			// The last member: remove the comma before it, merging with cuts that
			// already removed the members between.
			for b := s - 1; b > open; b-- {
				if m > 0 && b < cuts[m-1][1] {
					m--
					s = cuts[m][0]
					b = s
					continue
				}
				if body[b] == ',' {
					s = b
					break
				}
				if body[b] != ' ' && body[b] != '\t' && body[b] != '\n' && body[b] != '\r' {
					break
				}
			}
		}
		cuts[m] = [2]int{s, e}
		m++
	}
	n = m
	dst = append(dst, '{')
	dst = append(dst, extra...)
	sep := len(extra) > 0
	pos := open + 1
	for i := 0; i <= n; i++ {
		end := close
		if i < n {
			end = cuts[i][0]
		}
		seg := body[pos:end]
		if sep {
			if j := jsonlex.SkipWS(seg, 0); j < len(seg) {
				dst = append(dst, ',')
				seg = seg[j:]
				sep = false
			}
		}
		dst = append(dst, seg...)
		if i < n {
			pos = cuts[i][1]
		}
	}
	return append(dst, '}')
}

// appendRewrittenAll is AppendRewritten for a body that repeats a member to drop: it
// copies the members one by one, leaving out every copy of the fields in drop (bits).
func appendRewrittenAll(dst, body, extra []byte, drop uint64) []byte {
	dst = append(dst, '{')
	dst = append(dst, extra...)
	sep := len(extra) > 0
	i := jsonlex.SkipWS(body, jsonlex.SkipWS(body, 0)+1)
	for i < len(body) && body[i] == '"' {
		ke, esc, le := jsonlex.ScanString(body, i)
		if le != jsonlex.OK {
			break
		}
		j := jsonlex.SkipWS(body, ke)
		if j >= len(body) || body[j] != ':' {
			break
		}
		vs := jsonlex.SkipWS(body, j+1)
		ve, err := skipValue(body, vs, 1)
		if err != nil {
			break
		}
		if f := keyField(body[i:ke], esc); f >= numFields || drop&(1<<f) == 0 {
			if sep {
				dst = append(dst, ',')
			}
			dst = append(dst, body[i:ke]...)
			dst = append(dst, ':')
			dst = append(dst, body[vs:ve]...)
			sep = true
		}
		i = jsonlex.SkipWS(body, ve)
		if i < len(body) && body[i] == ',' {
			i = jsonlex.SkipWS(body, i+1)
		}
	}
	return append(dst, '}')
}

// AppendObjectWith appends the JSON object obj to dst with member key set to the raw
// value val (replacing any existing member of that name, placed first).
func AppendObjectWith(dst, obj []byte, key string, val []byte) []byte {
	dst = append(dst, '{', '"')
	dst = append(dst, key...)
	dst = append(dst, '"', ':')
	dst = append(dst, val...)
	i := jsonlex.SkipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return append(dst, '}')
	}
	i = jsonlex.SkipWS(obj, i+1)
	for i < len(obj) && obj[i] == '"' {
		ke, esc, le := jsonlex.ScanString(obj, i)
		if le != jsonlex.OK {
			break
		}
		k := obj[i:ke]
		j := jsonlex.SkipWS(obj, ke)
		if j >= len(obj) || obj[j] != ':' {
			break
		}
		vs := jsonlex.SkipWS(obj, j+1)
		ve, err := skipValue(obj, vs, 1)
		if err != nil {
			break
		}
		if !keyIs(k, esc, key) {
			dst = append(dst, ',')
			dst = append(dst, k...)
			dst = append(dst, ':')
			dst = append(dst, obj[vs:ve]...)
		}
		i = jsonlex.SkipWS(obj, ve)
		if i < len(obj) && obj[i] == ',' {
			i = jsonlex.SkipWS(obj, i+1)
		}
	}
	return append(dst, '}')
}

// HasElements says whether v, an array Scan validated, holds at least one element. It
// looks at the bytes after the bracket only: FirstElement would walk the whole first
// element (a long system prompt) to find where it ends.
func HasElements(v []byte) bool {
	i := jsonlex.SkipWS(v, 0)
	if i >= len(v) || v[i] != '[' {
		return false
	}
	i = jsonlex.SkipWS(v, i+1)
	return i < len(v) && v[i] != ']'
}

// FirstElement returns the first element of the JSON array v, or nil.
func FirstElement(v []byte) []byte {
	i := jsonlex.SkipWS(v, 0)
	if i >= len(v) || v[i] != '[' {
		return nil
	}
	i = jsonlex.SkipWS(v, i+1)
	e, err := skipValue(v, i, 1)
	if err != nil {
		return nil
	}
	return v[i:e]
}
