package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cloudwego/hertz/pkg/common/hlog"

	"github.com/kvgate/kvgate/proxy"
	"github.com/kvgate/kvgate/tokenize"
)

func init() {
	register("doctor", "probe each engine of a rule and report every contract parameter that disagrees", runDoctor)
}

// A doctor finding: one contract parameter of one endpoint.
type finding struct {
	endpoint, param string
	verdict         verdict
	detail          string
}

type verdict uint8

const (
	vOK    verdict = iota
	vSkip          // not checkable here (engine lacks the endpoint, no events yet)
	vDrift         // the engine and the rule disagree: KV-Exact would miss
	vError         // the probe failed (unreachable, bad answer)
)

var verdictNames = [...]string{"ok", "skip", "DRIFT", "ERROR"}

// The probe conversation: several roles, punctuation, digits and non-ASCII text, long
// enough for several 16-token blocks so the engine publishes BlockStored for it.
var probeMessages = []map[string]string{
	{"role": "system", "content": "You are kvgate's doctor probe. Answer in one short sentence; never use lists."},
	{"role": "user", "content": "Compare 3.14159 and 2.71828, then say «bonjour», 你好 and こんにちは — politely!"},
	{"role": "assistant", "content": "π is larger than e. Bonjour, 你好, こんにちは."},
	{"role": "user", "content": "Now count from one to twelve in words, separated by commas, and stop."},
}

const probePrompt = "kvgate doctor probe: the quick brown fox jumps over the lazy dog 1234567890 times; «café» 你好 こんにちは. " +
	"It repeats so that the prompt spans several blocks of the engine's KV cache, whatever their size."

type doctor struct {
	cfg    proxy.Config
	pool   *tokenize.Pool
	hc     *http.Client
	wait   time.Duration
	out    []finding
	server *proxy.Server
}

func (d *doctor) add(ep, param string, v verdict, format string, a ...any) {
	d.out = append(d.out, finding{ep, param, v, fmt.Sprintf(format, a...)})
}

func runDoctor(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wait := fs.Duration("events-wait", 3*time.Second, "how long to follow each engine's KV events after the probe request")
	timeout := fs.Duration("probe-timeout", 10*time.Second, "timeout of each HTTP probe")
	// Doctor's own flags come first; everything from the first unknown flag on is the
	// rule, exactly as `kvgate serve` takes it.
	own, rule := splitDoctorArgs(args)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvgate doctor [-events-wait D] [-probe-timeout D] <the serve flags of the rule>

Probes every endpoint of the rule: GET /v1/models (served models and LoRA adapters),
GET /metrics (vLLM's cache_config_info: block size, hash algo, prefix caching), the
engine's POST /tokenize on a probe conversation and prompt (kvgate's template and
tokenizer must produce the same tokens), and, with KV-Exact on, its KV events for a
few seconds after one probe request (parity of the engine's block keys with the
rule's hash contract: algo, seed, block size, LoRA). Exit 0: nothing disagrees;
1: a parameter disagrees or a probe failed; 2: bad flags.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(own); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	// net/http reads a timeout of 0 or less as none: a mute engine would hang the run.
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "kvgate doctor: -probe-timeout %v: must be positive\n", *timeout)
		return 2
	}
	if *wait < 0 {
		fmt.Fprintf(stderr, "kvgate doctor: -events-wait %v: must not be negative\n", *wait)
		return 2
	}
	cfg, _, err := serveFlags(rule, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvgate doctor:", err)
		return 2
	}
	tc, err := proxy.UpstreamTLS(&cfg)
	if err != nil {
		fmt.Fprintln(stderr, "kvgate doctor:", err)
		return 2
	}
	d := &doctor{cfg: cfg, wait: *wait,
		hc: &http.Client{Timeout: *timeout, Transport: &http.Transport{TLSClientConfig: tc}}}
	if code := d.run(stderr); code != 0 {
		return code
	}
	return d.report(stdout)
}

// splitDoctorArgs takes doctor's own leading flags off args.
func splitDoctorArgs(args []string) (own, rule []string) {
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		base, _, hasValue := strings.Cut(name, "=")
		switch base {
		case "events-wait", "probe-timeout":
			own = append(own, args[i])
			if !hasValue && i+1 < len(args) {
				i++
				own = append(own, args[i])
			}
		case "h", "help":
			own = append(own, args[i])
		default:
			rule = append(rule, args[i])
		}
	}
	return own, rule
}

func (d *doctor) run(stderr io.Writer) int {
	hlog.SetLevel(hlog.LevelError) // hertz's start/stop lines are not findings
	d.pool = tokenize.NewPool()
	for _, t := range d.cfg.Models.Tokenizers {
		if err := d.pool.Add(t.Model, t.Dir, t.Aliases...); err != nil {
			fmt.Fprintf(stderr, "kvgate doctor: -tokenizer %s=%s: %v\n", t.Model, t.Dir, err)
			return 2
		}
	}
	ctx := context.Background()
	if d.cfg.KV.Mode != proxy.KVOff {
		// The rule's own ingest path follows the events: the same subscriber, contract
		// and attestation `kvgate serve` would run, on no public port anyone uses.
		cfg := d.cfg
		cfg.Listener.Addr, cfg.Listener.AdminAddr, cfg.Health.Interval, cfg.Shutdown.Delay = "127.0.0.1:0", "", 0, 0
		s, err := proxy.New(cfg, proxy.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Tokenizers: d.pool})
		if err != nil {
			fmt.Fprintln(stderr, "kvgate doctor:", err)
			return 2
		}
		if err := s.Start(ctx); err != nil {
			fmt.Fprintln(stderr, "kvgate doctor:", err)
			return 1
		}
		defer func() {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			s.Shutdown(sctx) //nolint:errcheck
		}()
		d.server = s
		d.cfg.Fleet.Endpoints = s.Endpoints() // discover=dns names expanded, in the server's slots
		time.Sleep(300 * time.Millisecond)    // let subscribers connect before the probe request
	}
	for _, ep := range d.cfg.Fleet.Endpoints {
		model := d.checkModels(ep)
		d.checkMetrics(ep)
		d.checkTokenize(ep, model)
		if d.server != nil {
			d.probeRequest(ep, model)
		}
	}
	if d.server != nil {
		time.Sleep(d.wait)
		for i, ep := range d.cfg.Fleet.Endpoints {
			d.checkEvents(i, ep)
		}
	}
	return 0
}

func (d *doctor) report(w io.Writer) int {
	sort.SliceStable(d.out, func(i, j int) bool { return d.out[i].endpoint < d.out[j].endpoint })
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tCHECK\tRESULT\tDETAIL")
	bad := 0
	for _, f := range d.out {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.endpoint, f.param, verdictNames[f.verdict], f.detail)
		if f.verdict >= vDrift {
			bad++
		}
	}
	tw.Flush()
	if bad > 0 {
		fmt.Fprintf(w, "\n%d finding(s) disagree or failed: KV-Exact routing would miss on them\n", bad)
		return 1
	}
	fmt.Fprintln(w, "\nevery checked parameter agrees with the rule")
	return 0
}

func (d *doctor) get(ep proxy.EndpointSpec, path string) (int, []byte, error) {
	res, err := d.hc.Get(ep.URL + path)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	return res.StatusCode, b, err
}

func (d *doctor) post(ep proxy.EndpointSpec, path string, body any) (int, []byte, error) {
	b, _ := json.Marshal(body)
	res, err := d.hc.Post(ep.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	return res.StatusCode, out, err
}

// ruleNames is every served name the rule maps to a tokenizer, by tokenizer model.
func (d *doctor) ruleNames() map[string]string {
	out := map[string]string{}
	for _, t := range d.cfg.Models.Tokenizers {
		out[t.Model] = t.Model
		for _, a := range t.Aliases {
			out[a] = t.Model
		}
	}
	return out
}

// checkModels compares the served models and LoRA adapters with the rule; it returns
// the served name the other probes use.
func (d *doctor) checkModels(ep proxy.EndpointSpec) string {
	names := d.ruleNames()
	fallback := ""
	if len(d.cfg.Models.Tokenizers) > 0 {
		fallback = d.cfg.Models.Tokenizers[0].Model
	}
	code, body, err := d.get(ep, "/v1/models")
	if err != nil || code != 200 {
		d.add(ep.Name, "models", vError, "GET /v1/models: %s", httpProblem(code, body, err))
		return fallback
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Root   string  `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		d.add(ep.Name, "models", vError, "GET /v1/models: not the OpenAI list shape: %v", err)
		return fallback
	}
	use := ""
	var unknown, served []string
	for _, m := range list.Data {
		served = append(served, m.ID)
		if m.Parent != nil && *m.Parent != "" && *m.Parent != m.ID {
			// A LoRA adapter (vLLM: parent is the base model).
			if base, ok := d.cfg.Models.LoRA[m.ID]; !ok {
				d.add(ep.Name, "lora", vDrift, "engine serves adapter %q (base %q) the rule has no -lora for: its requests would hash without the LoRA name and miss", m.ID, *m.Parent)
			} else if names[*m.Parent] != names[base] {
				d.add(ep.Name, "lora", vDrift, "adapter %q: engine base %q, rule base %q", m.ID, *m.Parent, base)
			}
			continue
		}
		if _, ok := names[m.ID]; ok {
			if use == "" {
				use = m.ID
			}
		} else {
			unknown = append(unknown, m.ID)
		}
	}
	for a := range d.cfg.Models.LoRA {
		found := false
		for _, s := range served {
			found = found || s == a
		}
		if !found {
			d.add(ep.Name, "lora", vDrift, "rule maps adapter %q but the engine does not serve it", a)
		}
	}
	switch {
	case use == "" && len(d.cfg.Models.Tokenizers) > 0:
		d.add(ep.Name, "models", vDrift, "engine serves %s; the rule's -model names none of them", strings.Join(served, ", "))
		return fallback
	case len(unknown) > 0:
		d.add(ep.Name, "models", vDrift, "engine also serves %s with no -model/-tokenizer: its requests would route as kv-miss:model_unknown", strings.Join(unknown, ", "))
	case use == "":
		d.add(ep.Name, "models", vOK, "serves %s (no tokenizers in the rule)", strings.Join(served, ", "))
	default:
		d.add(ep.Name, "models", vOK, "serves %s", strings.Join(served, ", "))
	}
	return use
}

// checkMetrics reads vLLM's vllm:cache_config_info labels (the engine's CacheConfig).
func (d *doctor) checkMetrics(ep proxy.EndpointSpec) {
	code, body, err := d.get(ep, "/metrics")
	if err != nil || code != 200 {
		d.add(ep.Name, "metrics", vSkip, "GET /metrics: %s", httpProblem(code, body, err))
		return
	}
	labels := cacheConfigInfo(body)
	if labels == nil {
		d.add(ep.Name, "metrics", vSkip, "no vllm:cache_config_info on /metrics (not vLLM, or an old one)")
		return
	}
	if v := labels["enable_prefix_caching"]; v != "" && v != "True" && v != "true" {
		d.add(ep.Name, "prefix-caching", vDrift, "engine runs with prefix caching off (enable_prefix_caching=%s): nothing to route to", v)
	}
	if d.cfg.KV.Mode == proxy.KVOff {
		d.add(ep.Name, "metrics", vOK, "cache_config_info read (KV-Exact off: block size and hash not compared)")
		return
	}
	if bs, err := strconv.Atoi(labels["block_size"]); err == nil {
		// The endpoint's pinned block_size, when set, is what the rule hashes it with.
		want, flag := d.cfg.KV.BlockSize, "-kv-block-size "
		if ep.BlockSize > 0 {
			want, flag = ep.BlockSize, "-endpoint block_size="
		}
		if bs != want {
			d.add(ep.Name, "block-size", vDrift, "engine block_size=%d, rule %s%d", bs, flag, want)
		} else {
			d.add(ep.Name, "block-size", vOK, "%d", bs)
		}
	}
	if ep.Engine == proxy.EngineVLLM {
		if algo := labels["prefix_caching_hash_algo"]; algo != "" {
			want := d.cfg.KV.HashAlgo
			if want == "" {
				want = "sha256" // vLLM's default, which the rule assumes when the flag is unset
			}
			if algo != want {
				d.add(ep.Name, "hash-algo", vDrift, "engine --prefix-caching-hash-algo %s, rule -kv-hash-algo %s", algo, want)
			} else {
				d.add(ep.Name, "hash-algo", vOK, "%s", algo)
			}
		}
	}
}

// cacheConfigInfo returns the labels of the vllm:cache_config_info sample, nil if none.
func cacheConfigInfo(body []byte) map[string]string {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "vllm:cache_config_info{")
		if !ok {
			continue
		}
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			return nil
		}
		return parseLabels(rest[:end])
	}
	return nil
}

// parseLabels parses k="v",k2="v2" (Prometheus text escapes \" \\ \n).
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for len(s) > 0 {
		k, rest, ok := strings.Cut(s, "=\"")
		if !ok {
			break
		}
		var v strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				if rest[i] == 'n' {
					v.WriteByte('\n')
					continue
				}
			}
			v.WriteByte(rest[i])
		}
		out[strings.TrimSpace(k)] = v.String()
		if i >= len(rest) {
			break
		}
		s = strings.TrimPrefix(rest[i+1:], ",")
	}
	return out
}

// checkTokenize sends the probe conversation and prompt to the engine's POST /tokenize
// (vLLM's shape: {"model","messages","add_generation_prompt"} or {"model","prompt"},
// answered {"count","max_model_len","tokens"}) and compares with kvgate's tokens.
func (d *doctor) checkTokenize(ep proxy.EndpointSpec, served string) {
	base := d.ruleNames()[served]
	m := d.pool.Get(base)
	if m == nil {
		d.add(ep.Name, "tokenizer", vSkip, "no tokenizer in the rule for %q", served)
		return
	}
	msgs, _ := json.Marshal(probeMessages)
	mine, err := m.EncodeChat(nil, &tokenize.ChatInput{Messages: msgs, AddGenerationPrompt: true})
	if err != nil {
		d.add(ep.Name, "chat-template", vError, "kvgate cannot render the probe: %v", err)
		return
	}
	chatTokens, verdictChat := d.engineTokens(ep, "chat-template", map[string]any{"model": served, "messages": probeMessages, "add_generation_prompt": true})
	mineP, err := m.EncodePrompt(nil, probePrompt)
	if err != nil {
		d.add(ep.Name, "tokenizer", vError, "kvgate cannot tokenize the probe: %v", err)
		return
	}
	promptTokens, verdictPrompt := d.engineTokens(ep, "tokenizer", map[string]any{"model": served, "prompt": probePrompt})
	if verdictPrompt {
		if i := firstDiff(mineP, promptTokens); i >= 0 {
			d.add(ep.Name, "tokenizer", vDrift, "prompt tokens differ from token %d (engine %d tokens, kvgate %d): the tokenizer (or its BOS handling) is not the engine's; %s", i, len(promptTokens), len(mineP), around(promptTokens, mineP, i))
		} else {
			d.add(ep.Name, "tokenizer", vOK, "%d prompt tokens identical", len(mineP))
		}
	}
	if verdictChat {
		if i := firstDiff(mine, chatTokens); i >= 0 {
			d.add(ep.Name, "chat-template", vDrift, "chat tokens differ from token %d (engine %d tokens, kvgate %d): the chat template (or tokenizer) differs from the engine's; %s", i, len(chatTokens), len(mine), around(chatTokens, mine, i))
		} else {
			d.add(ep.Name, "chat-template", vOK, "%d chat tokens identical", len(mine))
		}
	}
}

func (d *doctor) engineTokens(ep proxy.EndpointSpec, param string, req map[string]any) ([]uint32, bool) {
	code, body, err := d.post(ep, "/tokenize", req)
	switch {
	case err != nil:
		d.add(ep.Name, param, vError, "POST /tokenize: %v", err)
		return nil, false
	case code == 404 || code == 405:
		d.add(ep.Name, param, vSkip, "engine has no POST /tokenize (%d)", code)
		return nil, false
	case code != 200:
		d.add(ep.Name, param, vError, "POST /tokenize: %s", httpProblem(code, body, nil))
		return nil, false
	}
	var r struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Count != len(r.Tokens) {
		d.add(ep.Name, param, vError, "POST /tokenize: not the {count, max_model_len, tokens} shape (%v)", err)
		return nil, false
	}
	return r.Tokens, true
}

func firstDiff(a, b []uint32) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func around(engine, mine []uint32, i int) string {
	win := func(t []uint32) []uint32 { return t[max(0, i-2):min(len(t), i+3)] }
	return fmt.Sprintf("engine %v, kvgate %v around it", win(engine), win(mine))
}

// probeRequest makes the engine cache the probe conversation (one generated token), so
// it publishes BlockStored events the attestation can check.
func (d *doctor) probeRequest(ep proxy.EndpointSpec, served string) {
	code, body, err := d.post(ep, "/v1/chat/completions", map[string]any{"model": served, "messages": probeMessages, "max_tokens": 1})
	if err != nil || code != 200 {
		d.add(ep.Name, "probe-request", vError, "POST /v1/chat/completions: %s", httpProblem(code, body, err))
	}
}

// checkEvents reads the rule's own attestation of the engine's block keys.
func (d *doctor) checkEvents(i int, ep proxy.EndpointSpec) {
	st, ok := d.server.IngestStatus(i)
	if !ok {
		return
	}
	contract := d.server.Contract(i)
	switch {
	case !st.Connected:
		d.add(ep.Name, "events", vError, "cannot subscribe to %s within %v: check events= and the engine's --kv-events-config", ep.Events, d.wait)
	case st.Batches == 0:
		d.add(ep.Name, "events", vSkip, "subscribed, but no KV events in %v (is the engine publishing? raise -events-wait)", d.wait)
	case st.Parity == "mismatch":
		param := "hash-contract"
		switch c := st.Cause; {
		case strings.HasPrefix(c, "block size"):
			param = "block-size"
		case strings.HasPrefix(c, "algo"):
			param = "hash-algo"
		case strings.HasPrefix(c, "seed"):
			param = "hash-seed"
		case strings.HasPrefix(c, "LoRA"), strings.HasPrefix(c, "extras"):
			param = "lora"
		}
		d.add(ep.Name, param, vDrift, "engine block keys differ from %s: %s", contract, st.Cause)
	case st.Parity == "ok":
		d.add(ep.Name, "hash-contract", vOK, "%s: %d BlockStored events attested", contract, st.ParityOK)
	default:
		d.add(ep.Name, "hash-contract", vSkip, "%d batches but none attestable (%s; events without token_ids?)", st.Batches, contract)
	}
	if st.Unkeyable > 0 {
		d.add(ep.Name, "events", vDrift, "%d BlockStored events could not be keyed", st.Unkeyable)
	}
}

func httpProblem(code int, body []byte, err error) string {
	if err != nil {
		return err.Error()
	}
	b := strings.TrimSpace(string(body))
	if len(b) > 200 {
		b = b[:200] + "..."
	}
	return fmt.Sprintf("HTTP %d %s", code, b)
}
