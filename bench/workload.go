// Package bench measures what a KV-aware router buys and costs: it starts simulated engines
// (bench/enginesim) and kvgate under each routing policy, replays a workload through them,
// and reports time to first token, delivered cache hits and per-endpoint load side by side,
// plus the routing overhead against a direct connection.
package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// Session is one client conversation: its turns run in order, each after the previous
// answer arrived plus Think. A chat session sends System (if any), then the growing history
// of user turns and the engine's answers; a completion session sends Prompts[0] once.
type Session struct {
	At        time.Duration // arrival of the first turn, from the run's start
	Chat      bool
	System    string
	Prompts   []string
	MaxTokens int
	Think     time.Duration
}

// Workload is a named list of sessions.
type Workload struct {
	Name     string
	Sessions []Session
}

// Requests counts the requests the workload sends.
func (w *Workload) Requests() int {
	n := 0
	for i := range w.Sessions {
		n += len(w.Sessions[i].Prompts)
	}
	return n
}

// Span is the arrival time of the last session.
func (w *Workload) Span() time.Duration {
	var m time.Duration
	for i := range w.Sessions {
		m = max(m, w.Sessions[i].At)
	}
	return m
}

// Text makes deterministic filler text: n words drawn from Words by a generator seeded
// with seed. Each word is written with a leading space, which byte-level BPE tokenizers
// (Qwen, Llama 3, GPT-4o) split into one pre-token per word, so text made of these words
// tokenizes the same wherever it is cut and concatenated; with a vocabulary filtered to
// single-token words (see FilterWords) n words are exactly n tokens.
func Text(words []string, seed uint64, n int) string {
	if len(words) == 0 {
		words = Words
	}
	r := rand.New(rand.NewPCG(seed, 0x6b766761746521))
	var b strings.Builder
	b.Grow(n * 7)
	for i := 0; i < n; i++ {
		b.WriteByte(' ')
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// SharedPrefix is K system prompts shared by M users, each holding a multi-turn chat.
type SharedPrefix struct {
	SystemPrompts int           // K
	Users         int           // M; user u uses system prompt u % K
	Turns         int           // turns per user
	SystemTokens  int           // words per system prompt
	TurnTokens    int           // words per user message
	MaxTokens     int           // output tokens per turn
	Spread        time.Duration // users arrive uniformly over this window
	Think         time.Duration // pause between a user's turns
	Seed          uint64
	Words         []string
}

// Build generates the sessions.
func (c SharedPrefix) Build() Workload {
	r := rand.New(rand.NewPCG(c.Seed, 1))
	k := max(c.SystemPrompts, 1)
	systems := make([]string, k)
	for i := range systems {
		systems[i] = fmt.Sprintf("You are assistant %d.", i) + Text(c.Words, c.Seed*1000+uint64(i), c.SystemTokens)
	}
	w := Workload{Name: fmt.Sprintf("shared-prefix (K=%d system prompts x M=%d users x %d turns)", k, c.Users, c.Turns)}
	for u := 0; u < c.Users; u++ {
		s := Session{Chat: true, System: systems[u%k], MaxTokens: c.MaxTokens, Think: c.Think}
		if c.Spread > 0 {
			s.At = time.Duration(r.Int64N(int64(c.Spread)))
		}
		for t := 0; t < max(c.Turns, 1); t++ {
			s.Prompts = append(s.Prompts, fmt.Sprintf("User %d asks question %d:", u, t)+Text(c.Words, c.Seed<<20+uint64(u)<<8+uint64(t), c.TurnTokens))
		}
		w.Sessions = append(w.Sessions, s)
	}
	sort.SliceStable(w.Sessions, func(i, j int) bool { return w.Sessions[i].At < w.Sessions[j].At })
	return w
}

// RAG is single-turn questions over a shared document set: each query cites Docs documents
// drawn from a Zipf distribution (popular documents recur), in the order drawn.
type RAG struct {
	Documents, DocTokens, Queries, DocsPerQuery, QueryTokens, MaxTokens int
	Spread                                                              time.Duration
	Zipf                                                                float64 // s > 1; default 1.2
	Seed                                                                uint64
	Words                                                               []string
}

// Build generates the sessions.
func (c RAG) Build() Workload {
	r := rand.New(rand.NewPCG(c.Seed, 2))
	docs := make([]string, max(c.Documents, 1))
	for i := range docs {
		docs[i] = fmt.Sprintf("\n\nDocument %d:", i) + Text(c.Words, c.Seed*7919+uint64(i), c.DocTokens)
	}
	s := c.Zipf
	if s <= 1 {
		s = 1.2
	}
	z := rand.NewZipf(rand.New(rand.NewPCG(c.Seed, 3)), s, 1, uint64(len(docs)-1))
	w := Workload{Name: fmt.Sprintf("RAG (%d documents, %d per query, %d queries)", len(docs), c.DocsPerQuery, c.Queries)}
	system := "Answer using only the documents below."
	for q := 0; q < c.Queries; q++ {
		var b strings.Builder
		seen := map[uint64]bool{}
		for len(seen) < min(max(c.DocsPerQuery, 1), len(docs)) {
			d := z.Uint64()
			if seen[d] {
				continue
			}
			seen[d] = true
			b.WriteString(docs[d])
		}
		b.WriteString(fmt.Sprintf("\n\nQuestion %d:", q))
		b.WriteString(Text(c.Words, c.Seed<<24+uint64(q), c.QueryTokens))
		sess := Session{Chat: true, System: system, Prompts: []string{b.String()}, MaxTokens: c.MaxTokens}
		if c.Spread > 0 {
			sess.At = time.Duration(r.Int64N(int64(c.Spread)))
		}
		w.Sessions = append(w.Sessions, sess)
	}
	sort.SliceStable(w.Sessions, func(i, j int) bool { return w.Sessions[i].At < w.Sessions[j].At })
	return w
}

// HotPrefix is single-turn chat requests over a few hot system prompts: each request is
// one prefix, drawn with Zipf-skewed popularity, plus a unique user message, arriving as a
// Poisson process. Routing on overlap alone sends every request of the top prefix to the
// one engine that holds it; a load-aware router spreads them.
type HotPrefix struct {
	Prefixes     int           // system prompts (default 6)
	PrefixTokens [2]int        // words per system prompt, drawn uniformly in [min, max] (default 300..2000)
	Requests     int           // requests in the run
	SuffixTokens int           // words per user message
	MaxTokens    int           // output tokens per request
	Window       time.Duration // Poisson arrivals at Requests/Window per second
	Zipf         float64       // skew s >= 0: prefix k (0-based) has weight 1/(k+1)^s; 0 = uniform
	Seed         uint64
	Words        []string
}

// Build generates the sessions.
func (c HotPrefix) Build() Workload {
	k := c.Prefixes
	if k <= 0 {
		k = 6
	}
	lo, hi := c.PrefixTokens[0], c.PrefixTokens[1]
	if lo <= 0 && hi <= 0 {
		lo, hi = 300, 2000
	}
	hi = max(hi, lo)
	r := rand.New(rand.NewPCG(c.Seed, 4))
	systems := make([]string, k)
	for i := range systems {
		n := lo + r.IntN(hi-lo+1)
		systems[i] = fmt.Sprintf("You are hot assistant %d.", i) + Text(c.Words, c.Seed*104729+uint64(i), n)
	}
	pick := zipfPicker(k, c.Zipf)
	w := Workload{Name: fmt.Sprintf("hot-prefix (%d system prompts, Zipf s=%.2g, %d requests)", k, max(c.Zipf, 0), c.Requests)}
	var at float64 // seconds
	rate := float64(c.Requests) / max(c.Window.Seconds(), 1e-9)
	for q := 0; q < c.Requests; q++ {
		if c.Window > 0 && q > 0 {
			at += r.ExpFloat64() / rate
		}
		sess := Session{At: time.Duration(at * float64(time.Second)), Chat: true, System: systems[pick(r.Float64())],
			MaxTokens: c.MaxTokens,
			Prompts:   []string{fmt.Sprintf("Request %d:", q) + Text(c.Words, c.Seed<<28+uint64(q), c.SuffixTokens)}}
		w.Sessions = append(w.Sessions, sess)
	}
	return w
}

// zipfPicker maps a uniform u in [0,1) to k in [0,n) with P(k) proportional to 1/(k+1)^s.
// (math/rand's Zipf needs s > 1; hot-prefix skews are often near or below 1.)
func zipfPicker(n int, s float64) func(u float64) int {
	s = max(s, 0)
	cdf := make([]float64, n)
	var sum float64
	for k := range cdf {
		sum += math.Pow(float64(k+1), -s)
		cdf[k] = sum
	}
	return func(u float64) int {
		x := u * sum
		i, _ := slices.BinarySearch(cdf, x)
		return min(i, n-1)
	}
}

// Trace replays a Mooncake-format JSONL trace: one request per line,
// {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [..]}. Each hash id
// stands for one 512-token block of the original prompt; here it becomes BlockTokens
// deterministic words seeded by the id, so requests sharing leading hash ids share a
// textual (and so token) prefix. The last block is cut to input_length's remainder,
// scaled the same way.
type Trace struct {
	Path        string
	BlockTokens int     // words per hash id (default 512; smaller shrinks prompts)
	TimeScale   float64 // arrival times are multiplied by this (default 1)
	Limit       int     // first N requests (0 = all)
	MaxTokens   int     // cap on output_length (0 = no cap)
	Words       []string
}

type traceLine struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// Build reads the trace file.
func (c Trace) Build() (Workload, error) {
	f, err := os.Open(c.Path)
	if err != nil {
		return Workload{}, err
	}
	defer f.Close()
	return c.read(f)
}

func (c Trace) read(rd io.Reader) (Workload, error) {
	bt := c.BlockTokens
	if bt <= 0 {
		bt = 512
	}
	scale := c.TimeScale
	if scale <= 0 {
		scale = 1
	}
	w := Workload{Name: "trace " + c.Path}
	blocks := map[uint64]string{}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		txt := strings.TrimSpace(sc.Text())
		if txt == "" {
			continue
		}
		var tl traceLine
		if err := json.Unmarshal([]byte(txt), &tl); err != nil {
			return Workload{}, fmt.Errorf("%s:%d: %v", c.Path, line, err)
		}
		if len(tl.HashIDs) == 0 || tl.InputLength <= 0 {
			return Workload{}, fmt.Errorf("%s:%d: need hash_ids and a positive input_length", c.Path, line)
		}
		if tl.Timestamp < 0 {
			return Workload{}, fmt.Errorf("%s:%d: negative timestamp", c.Path, line)
		}
		var b strings.Builder
		for i, id := range tl.HashIDs {
			n := bt
			if i == len(tl.HashIDs)-1 {
				// The original last block holds input_length - 512*(len-1) tokens.
				rem := tl.InputLength - 512*(len(tl.HashIDs)-1)
				n = max(1, min(bt, rem*bt/512))
			}
			if n == bt {
				t, ok := blocks[id]
				if !ok {
					t = Text(c.Words, id+1, bt)
					blocks[id] = t
				}
				b.WriteString(t)
			} else {
				b.WriteString(Text(c.Words, id+1, n))
			}
		}
		out := max(tl.OutputLength, 1)
		if c.MaxTokens > 0 {
			out = min(out, c.MaxTokens)
		}
		w.Sessions = append(w.Sessions, Session{At: time.Duration(tl.Timestamp * scale * float64(time.Millisecond)),
			Prompts: []string{b.String()}, MaxTokens: out})
		if c.Limit > 0 && len(w.Sessions) >= c.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return Workload{}, fmt.Errorf("%s: %v", c.Path, err)
	}
	if len(w.Sessions) == 0 {
		return Workload{}, fmt.Errorf("%s: no requests", c.Path)
	}
	sort.SliceStable(w.Sessions, func(i, j int) bool { return w.Sessions[i].At < w.Sessions[j].At })
	return w, nil
}

// FilterWords keeps the words that enc turns into exactly one token when written with a
// leading space, so Text's word count is its token count. With no encoder, or when fewer
// than 64 words survive, it returns words unchanged.
func FilterWords(enc interface {
	EncodePrompt(dst []uint32, prompt string) ([]uint32, error)
}, words []string) []string {
	if enc == nil {
		return words
	}
	base, err := enc.EncodePrompt(nil, "")
	if err != nil {
		return words
	}
	var out []string
	var buf []uint32
	for _, w := range words {
		buf, err = enc.EncodePrompt(buf[:0], " "+w)
		if err == nil && len(buf) == len(base)+1 {
			out = append(out, w)
		}
	}
	if len(out) < 64 {
		return words
	}
	return out
}
