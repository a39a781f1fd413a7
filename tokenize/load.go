package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// The tokenizer.json schema, as far as token IDs depend on it. Unknown component types fail
// the load with an error naming them: we never guess how an unknown component behaves.

type jsonTokenizer struct {
	AddedTokens   []jsonAddedToken `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Model         json.RawMessage  `json:"model"`
}

type jsonAddedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type jsonPattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type jsonComponent struct {
	Type string `json:"type"`
	// Sequence
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	// Prepend / Replace / Strip
	Prepend    string      `json:"prepend"`
	Pattern    jsonPattern `json:"pattern"`
	Content    string      `json:"content"`
	StripLeft  *bool       `json:"strip_left"`
	StripRight *bool       `json:"strip_right"`
	// Split
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
	// ByteLevel
	AddPrefixSpace *bool `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`
	// Metaspace
	Replacement   string `json:"replacement"`
	PrependScheme string `json:"prepend_scheme"`
	Split         *bool  `json:"split"`
	// Digits
	IndividualDigits bool `json:"individual_digits"`
	// TemplateProcessing
	Single        []json.RawMessage                 `json:"single"`
	SpecialTokens map[string]jsonTemplateSpecialTok `json:"special_tokens"`
	// BertProcessing / RobertaProcessing
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

type jsonTemplateSpecialTok struct {
	ID  string   `json:"id"`
	IDs []uint32 `json:"ids"`
}

type jsonBPE struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  jsonMerges        `json:"merges"`
}

// jsonMerges reads the merge list: ["a", "b"] pairs (current files) or "a b" strings (older).
type jsonMerges [][2]string

func (m *jsonMerges) UnmarshalJSON(b []byte) error {
	var pairs [][2]string
	if err := json.Unmarshal(b, &pairs); err == nil {
		*m = pairs
		return nil
	}
	var strs []string
	if err := json.Unmarshal(b, &strs); err != nil {
		return fmt.Errorf("merges: want [a, b] pairs or \"a b\" strings: %w", err)
	}
	*m = make([][2]string, len(strs))
	for i, s := range strs {
		a, b, ok := strings.Cut(s, " ")
		if !ok || strings.Contains(b, " ") {
			return fmt.Errorf("merge %d %q is not two tokens separated by one space", i, s)
		}
		(*m)[i] = [2]string{a, b}
	}
	return nil
}

func isNull(m json.RawMessage) bool {
	m = bytes.TrimSpace(m)
	return len(m) == 0 || string(m) == "null"
}

// LoadTokenizer loads a HF tokenizer.json file.
func LoadTokenizer(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	t, err := parseTokenizer(data)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	return t, nil
}

func parseTokenizer(data []byte) (*Tokenizer, error) {
	loadClasses()
	var jt jsonTokenizer
	if err := json.Unmarshal(data, &jt); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	t := &Tokenizer{}
	var err error
	if !isNull(jt.Normalizer) {
		if t.norm, err = parseNormalizer(jt.Normalizer); err != nil {
			return nil, fmt.Errorf("normalizer: %w", err)
		}
	}
	if !isNull(jt.PreTokenizer) {
		if t.pre, err = parsePreTokenizer(jt.PreTokenizer); err != nil {
			return nil, fmt.Errorf("pre_tokenizer: %w", err)
		}
	}
	byteLevel := false
	for i, p := range t.pre {
		if p.kind == preByteLevel {
			if i != len(t.pre)-1 {
				return nil, errors.New("pre_tokenizer: ByteLevel followed by another pre-tokenizer is not supported")
			}
			byteLevel = true
		}
	}
	if isNull(jt.Model) {
		return nil, errors.New("model is missing")
	}
	if t.model, err = parseBPE(jt.Model, byteLevel); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if err = t.loadAddedTokens(jt.AddedTokens); err != nil {
		return nil, err
	}
	if !isNull(jt.PostProcessor) {
		if err = t.parsePostProcessor(jt.PostProcessor); err != nil {
			return nil, fmt.Errorf("post_processor: %w", err)
		}
	}
	t.init()
	return t, nil
}

func parseNormalizer(raw json.RawMessage) ([]normStep, error) {
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var steps []normStep
		for _, n := range c.Normalizers {
			s, err := parseNormalizer(n)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "NFC":
		return []normStep{{kind: normNFC, form: norm.NFC}}, nil
	case "NFD":
		return []normStep{{kind: normNFD, form: norm.NFD}}, nil
	case "NFKC":
		return []normStep{{kind: normNFKC, form: norm.NFKC}}, nil
	case "NFKD":
		return []normStep{{kind: normNFKD, form: norm.NFKD}}, nil
	case "Prepend":
		return []normStep{{kind: normPrepend, str: c.Prepend}}, nil
	case "Replace":
		st := normStep{kind: normReplace, content: c.Content}
		switch {
		case c.Pattern.String != nil:
			if *c.Pattern.String == "" {
				return nil, nil // an empty pattern never matches
			}
			st.str = *c.Pattern.String
		case c.Pattern.Regex != nil:
			re, err := regexp2.Compile(*c.Pattern.Regex, regexp2.None)
			if err != nil {
				return nil, fmt.Errorf("Replace regex %q: %w", *c.Pattern.Regex, err)
			}
			re.MatchTimeout = regexTimeout
			st.re = re
		default:
			return nil, errors.New("Replace without a pattern")
		}
		return []normStep{st}, nil
	case "Lowercase":
		return []normStep{{kind: normLowercase}}, nil
	case "Strip":
		st := normStep{kind: normStrip, left: true, right: true}
		if c.StripLeft != nil {
			st.left = *c.StripLeft
		}
		if c.StripRight != nil {
			st.right = *c.StripRight
		}
		return []normStep{st}, nil
	}
	return nil, fmt.Errorf("unsupported normalizer type %q", c.Type)
}

// Pre-tokenizer step kinds.
const (
	preSplit uint8 = iota + 1
	preByteLevel
	preMetaspace
	preCharSplit // split on single characters of a class (Digits, WhitespaceSplit)
)

// Metaspace prepend schemes.
const (
	prependAlways uint8 = iota
	prependFirst
	prependNever
)

type preStep struct {
	kind   uint8
	pat    *pattern
	beh    uint8
	invert bool
	// ByteLevel
	addPrefixSpace, useRegex bool
	// Metaspace
	replacement   string
	prependScheme uint8
	split         bool
}

func parsePreTokenizer(raw json.RawMessage) ([]preStep, error) {
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var steps []preStep
		for _, p := range c.Pretokenizers {
			s, err := parsePreTokenizer(p)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "Split":
		beh, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, err
		}
		st := preStep{kind: preSplit, beh: beh, invert: c.Invert}
		switch {
		case c.Pattern.String != nil:
			st.pat = &pattern{lit: *c.Pattern.String}
			if st.pat.lit == "" {
				st.pat = nil // never matches: the piece stays whole
			}
		case c.Pattern.Regex != nil:
			if st.pat, err = newRegexPattern(*c.Pattern.Regex); err != nil {
				return nil, err
			}
		default:
			return nil, errors.New("Split without a pattern")
		}
		return []preStep{st}, nil
	case "ByteLevel":
		st := preStep{kind: preByteLevel, addPrefixSpace: true, useRegex: true}
		if c.AddPrefixSpace != nil {
			st.addPrefixSpace = *c.AddPrefixSpace
		}
		if c.UseRegex != nil {
			st.useRegex = *c.UseRegex
		}
		if st.useRegex {
			st.pat, _ = newRegexPattern(reGPT2)
		}
		return []preStep{st}, nil
	case "Metaspace":
		st := preStep{kind: preMetaspace, replacement: c.Replacement, split: true, prependScheme: prependAlways}
		if st.replacement == "" {
			st.replacement = "\u2581"
		}
		if c.Split != nil {
			st.split = *c.Split
		}
		switch c.PrependScheme {
		case "always":
		case "first":
			st.prependScheme = prependFirst
		case "never":
			st.prependScheme = prependNever
		case "":
			if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				st.prependScheme = prependNever
			}
		default:
			return nil, fmt.Errorf("unknown Metaspace prepend_scheme %q", c.PrependScheme)
		}
		return []preStep{st}, nil
	case "Digits":
		beh := behContiguous
		if c.IndividualDigits {
			beh = behIsolated
		}
		return []preStep{{kind: preCharSplit, pat: &pattern{scan: scanCharClass, class: cN}, beh: beh}}, nil
	case "WhitespaceSplit":
		return []preStep{{kind: preCharSplit, pat: &pattern{scan: scanCharClass, class: cSpace}, beh: behRemoved}}, nil
	}
	return nil, fmt.Errorf("unsupported pre-tokenizer type %q", c.Type)
}

func parseBPE(raw json.RawMessage, byteLevel bool) (*bpeModel, error) {
	var head struct {
		Type   string          `json:"type"`
		Merges json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, err
	}
	if head.Type != "BPE" && !(head.Type == "" && head.Merges != nil) {
		return nil, fmt.Errorf("unsupported model type %q (only BPE is implemented)", head.Type)
	}
	var jm jsonBPE
	if err := json.Unmarshal(raw, &jm); err != nil {
		return nil, err
	}
	if jm.Dropout != nil && *jm.Dropout > 0 {
		return nil, fmt.Errorf("BPE dropout %v makes encoding random", *jm.Dropout)
	}
	m := &bpeModel{
		byteLevel:    byteLevel,
		byteFallback: jm.ByteFallback,
		fuseUnk:      jm.FuseUnk,
		ignoreMerges: jm.IgnoreMerges,
		unkID:        -1,
		vocabSize:    len(jm.Vocab),
	}
	if jm.ContinuingSubwordPrefix != nil {
		m.prefix = *jm.ContinuingSubwordPrefix
	}
	if jm.EndOfWordSuffix != nil {
		m.suffix = *jm.EndOfWordSuffix
	}
	if byteLevel && (m.prefix != "" || m.suffix != "") {
		return nil, errors.New("byte-level BPE with continuing_subword_prefix or end_of_word_suffix is not supported")
	}
	if jm.UnkToken != nil {
		id, ok := jm.Vocab[*jm.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", *jm.UnkToken)
		}
		m.unkID = int64(id)
	}
	m.merges = make(map[uint64]uint64, len(jm.Merges))
	for rank, pair := range jm.Merges {
		a, b := pair[0], pair[1]
		aid, ok1 := jm.Vocab[a]
		bid, ok2 := jm.Vocab[b]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("merge %d (%q %q): token not in the vocabulary", rank, a, b)
		}
		if len(m.prefix) > len(b) || !strings.HasPrefix(b, m.prefix) {
			return nil, fmt.Errorf("merge %d: %q lacks the continuing subword prefix", rank, b)
		}
		nid, ok := jm.Vocab[a+b[len(m.prefix):]]
		if !ok {
			return nil, fmt.Errorf("merge %d: %q is not in the vocabulary", rank, a+b[len(m.prefix):])
		}
		// A repeated pair keeps its last rank, as HF's HashMap collect does.
		m.merges[uint64(aid)<<32|uint64(bid)] = uint64(rank)<<32 | uint64(nid)
	}
	for i := range m.fallback {
		m.fallback[i] = -1
		if id, ok := jm.Vocab[fallbackToken(byte(i))]; ok {
			m.fallback[i] = int64(id)
		}
	}
	for i := range m.asciiID {
		m.asciiID[i] = -1
		if id, ok := jm.Vocab[string(rune(i))]; ok {
			m.asciiID[i] = int64(id)
		}
	}
	if byteLevel {
		b2u := bytesToUnicode()
		inv := make(map[rune]byte, 256)
		for b, r := range b2u {
			inv[r] = byte(b)
		}
		for i := range m.byteID {
			m.byteID[i] = -1
			if id, ok := jm.Vocab[string(b2u[i])]; ok {
				m.byteID[i] = int64(id)
			}
		}
		m.vocab = make(map[string]uint32, len(jm.Vocab))
		for s, id := range jm.Vocab {
			// A token that is not a byte-level string can never come out of byte-level input.
			if raw, ok := decodeByteLevel(s, inv); ok {
				m.vocab[raw] = id
			}
		}
	} else {
		m.vocab = jm.Vocab
	}
	m.vocabStrings = jm.Vocab
	m.setupMetaChunks()
	return m, nil
}

// loadAddedTokens assigns IDs as HF AddedVocabulary::add_tokens does (the model's own ID when
// the content is in the vocabulary) and builds the two matchers: tokens matched on raw text
// (normalized=false) and on normalized text (normalized=true, pattern normalized too).
func (t *Tokenizer) loadAddedTokens(jts []jsonAddedToken) error {
	addedIDs := map[string]uint32{}
	maxID, haveMax := uint32(0), false
	var special, plain []addedToken
	specialSet := map[string]bool{}
	for _, j := range jts {
		if j.Content == "" {
			continue
		}
		tok := addedToken{content: j.Content, singleWord: j.SingleWord, lstrip: j.Lstrip, rstrip: j.Rstrip,
			normalized: j.Normalized, special: j.Special}
		id, ok := addedIDs[j.Content]
		if !ok {
			if v, ok2 := t.model.vocabStrings[j.Content]; ok2 {
				id, ok = v, true
			}
		}
		if !ok {
			vs := uint32(t.model.vocabSize)
			switch {
			case !haveMax:
				id = vs
			case maxID >= vs || vs == 0:
				id = maxID + 1
			default:
				id = vs
			}
		}
		addedIDs[j.Content] = id
		if !haveMax || id > maxID {
			maxID, haveMax = id, true
		}
		tok.id = id
		if j.Special {
			if !specialSet[j.Content] {
				specialSet[j.Content] = true
				special = append(special, tok)
			}
		} else if !specialSet[j.Content] {
			plain = append(plain, tok)
		}
	}
	all := append(append([]addedToken(nil), special...), plain...)
	var raw, normd []addedToken
	for _, tok := range all {
		if tok.normalized {
			normd = append(normd, tok)
		} else {
			raw = append(raw, tok)
		}
	}
	t.rawTrie = newTokenTrie(raw, func(a addedToken) string { return a.content })
	var buf [2][]byte
	var it norm.Iter
	var nerr error
	t.normTrie = newTokenTrie(normd, func(a addedToken) string {
		s, err := normalize(t.norm, a.content, &buf, &it)
		if err != nil && nerr == nil {
			nerr = err
		}
		return strings.Clone(s)
	})
	if nerr != nil {
		return fmt.Errorf("added tokens: %w", nerr)
	}
	t.addedByContent = addedIDs
	return nil
}

func (t *Tokenizer) parsePostProcessor(raw json.RawMessage) error {
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return err
	}
	switch c.Type {
	case "ByteLevel":
		return nil // trims offsets only; no IDs
	case "Sequence":
		for _, p := range c.Processors {
			if err := t.parsePostProcessor(p); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		var prefix, suffix []uint32
		seenA := false
		for _, piece := range c.Single {
			var p struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			}
			if err := json.Unmarshal(piece, &p); err != nil {
				return err
			}
			switch {
			case p.Sequence != nil:
				if seenA {
					return errors.New("TemplateProcessing single template has two sequences")
				}
				seenA = true
			case p.SpecialToken != nil:
				st, ok := c.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("TemplateProcessing: special token %q is not defined", p.SpecialToken.ID)
				}
				if seenA {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			default:
				return fmt.Errorf("TemplateProcessing: unknown piece %s", piece)
			}
		}
		// A later processor wraps the output of the earlier ones.
		t.postPrefix = append(prefix, t.postPrefix...)
		t.postSuffix = append(t.postSuffix, suffix...)
		return nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenPairID(c.Cls)
		if err != nil {
			return fmt.Errorf("%s cls: %w", c.Type, err)
		}
		sep, err := tokenPairID(c.Sep)
		if err != nil {
			return fmt.Errorf("%s sep: %w", c.Type, err)
		}
		t.postPrefix = append([]uint32{cls}, t.postPrefix...)
		t.postSuffix = append(t.postSuffix, sep)
		return nil
	}
	return fmt.Errorf("unsupported post-processor type %q", c.Type)
}

func tokenPairID(p []json.RawMessage) (uint32, error) {
	if len(p) != 2 {
		return 0, errors.New("want [token, id]")
	}
	var id uint32
	err := json.Unmarshal(p[1], &id)
	return id, err
}
