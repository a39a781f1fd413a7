package bench

import (
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

// WriteTable writes the comparison table (Markdown; readable as plain text too).
func (r *Result) WriteTable(w io.Writer) {
	fmt.Fprintln(w, "| policy | requests | errors | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | e2e p50 ms | e2e p99 ms | delivered hit ratio | load imbalance (max/mean prefill) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i := range r.Policies {
		p := &r.Policies[i]
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s | %s | %.1f%% | %.2f |\n", p.Policy, p.Requests, p.Errors,
			ms(Percentile(p.TTFT, 50)), ms(Percentile(p.TTFT, 90)), ms(Percentile(p.TTFT, 99)),
			ms(Percentile(p.E2E, 50)), ms(Percentile(p.E2E, 99)), 100*p.HitRatio(), p.Imbalance())
	}
}

// Find returns the named policy's result.
func (r *Result) Find(name string) *PolicyResult {
	for i := range r.Policies {
		if r.Policies[i].Policy == name {
			return &r.Policies[i]
		}
	}
	return nil
}

// WriteReport writes the Markdown report; plots are file names (relative to the report)
// of the figures to embed, in order.
func (r *Result) WriteReport(w io.Writer, title string, plots []string) {
	fmt.Fprintf(w, "# %s\n\n", title)
	fmt.Fprintf(w, "Workload: %s. %d simulated engines per policy, each started fresh.\n\n", r.Workload, r.Engines)
	r.writeSetup(w)
	r.writeSections(w, "##", plots)
	writeFootnote(w)
}

// writeSetup describes the machine, the engine model and the policies.
func (r *Result) writeSetup(w io.Writer) {
	fmt.Fprintf(w, "Machine: %d CPUs (GOMAXPROCS %d), %s %s/%s. Engines run in the harness process; kvgate is a child process.\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	s := r.Sim
	fmt.Fprintf(w, "Engine model: %s, block size %d, %d KV blocks, batch %d; prefill = %v + %v x uncached token; decode %v per output token.\n\n",
		orDefault(s.Engine, "vllm"), s.BlockSize, s.NumBlocks, s.MaxBatch, s.PrefillBase, s.PrefillPerToken, s.DecodePerToken)
	if len(r.KvgateArgs) > 0 {
		fmt.Fprintf(w, "kvgate flags added to every kvgate policy: `%s`.\n\n", strings.Join(r.KvgateArgs, " "))
	}
	if r.Replicas > 1 {
		fmt.Fprintf(w, "Every kvgate policy ran %d `kvgate serve` replicas, each subscribed to every engine; clients (sessions) were spread over them round-robin.\n\n", r.Replicas)
	}
	fmt.Fprintln(w, policyLegend)
	fmt.Fprintln(w)
}

// writeSections writes the comparison, the targets, the load per endpoint, the errors and
// the plots under headings of level h ("##").
func (r *Result) writeSections(w io.Writer, h string, plots []string) {
	fmt.Fprintf(w, "%s Comparison\n\n", h)
	r.WriteTable(w)
	fmt.Fprintln(w)
	r.WriteTargets(w)
	fmt.Fprintf(w, "%s Load per endpoint\n\n", h)
	fmt.Fprint(w, "| policy |")
	for i := 0; i < r.Engines; i++ {
		fmt.Fprintf(w, " e%d requests | e%d prefill tokens |", i, i)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "|---|")
	for i := 0; i < r.Engines; i++ {
		fmt.Fprint(w, "---:|---:|")
	}
	fmt.Fprintln(w)
	for _, p := range r.Policies {
		fmt.Fprintf(w, "| %s |", p.Policy)
		for _, e := range p.Endpoints {
			fmt.Fprintf(w, " %d | %d |", e.Requests, e.PromptTokens-e.CachedTokens)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	for _, p := range r.Policies {
		if len(p.ReplicaRequests) > 0 {
			fmt.Fprintf(w, "- %s requests per kvgate replica: %s\n", p.Policy, strings.Trim(fmt.Sprint(p.ReplicaRequests), "[]"))
		}
	}
	if r.Replicas > 1 {
		fmt.Fprintln(w)
	}
	var errs []string
	for _, p := range r.Policies {
		if p.FirstErr != "" {
			errs = append(errs, fmt.Sprintf("- %s: %d errors, first: `%s`", p.Policy, p.Errors, strings.ReplaceAll(p.FirstErr, "`", "'")))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "%s Errors\n\n", h)
		fmt.Fprintln(w, strings.Join(errs, "\n"))
		fmt.Fprintln(w)
	}
	if len(plots) > 0 {
		fmt.Fprintf(w, "%s Plots\n\n", h)
		writeImages(w, plots)
	}
}

func writeImages(w io.Writer, plots []string) {
	for _, p := range plots {
		fmt.Fprintf(w, "![%s](%s)\n\n", strings.TrimSuffix(p, filepath.Ext(p)), p)
	}
}

func writeFootnote(w io.Writer) {
	fmt.Fprintln(w, "Delivered hit ratio = sum of usage.prompt_tokens_details.cached_tokens / sum of prompt_tokens over")
	fmt.Fprintln(w, "successful requests, as the engines reported them. Load imbalance = the busiest engine's prefill")
	fmt.Fprintln(w, "work (uncached prompt tokens) over the mean (1.00 = even).")
}

// SweepPlots are one sweep's figure files: the TTFT-versus-load plot ("" with one level)
// and each level's plots.
type SweepPlots struct {
	Load   string
	Levels [][]string
}

// WriteSweepReport writes the Markdown report of one or more workloads, each swept over
// load levels: per workload a TTFT-versus-load table and plot, then per level the full
// comparison. plots[i] belongs to sweeps[i] (missing entries embed nothing).
func WriteSweepReport(w io.Writer, title string, sweeps []*Sweep, plots []SweepPlots) {
	fmt.Fprintf(w, "# %s\n\n", title)
	var first *Result
	for _, sw := range sweeps {
		if len(sw.Levels) > 0 {
			first = sw.Levels[0].Result
			break
		}
	}
	if first == nil {
		fmt.Fprintln(w, "No results.")
		return
	}
	fmt.Fprintf(w, "%d simulated engines per policy, each started fresh for every policy and load level. Load levels multiply the workload's arrival rate (arrival times and think times divided by the multiplier).\n\n", first.Engines)
	first.writeSetup(w)
	for i, sw := range sweeps {
		var sp SweepPlots
		if i < len(plots) {
			sp = plots[i]
		}
		fmt.Fprintf(w, "## Workload: %s\n\n", sw.Workload)
		sw.WriteLoadTable(w)
		fmt.Fprintln(w)
		if sp.Load != "" {
			writeImages(w, []string{sp.Load})
		}
		for j, lv := range sw.Levels {
			var lp []string
			if j < len(sp.Levels) {
				lp = sp.Levels[j]
			}
			fmt.Fprintf(w, "### Rate %s: %d requests over ~%.1fs\n\n", LevelName(lv.RateScale), lv.Requests, lv.Span.Seconds())
			lv.Result.writeSections(w, "####", lp)
		}
	}
	writeFootnote(w)
}

// WriteLoadTable writes TTFT p50 / p90 (ms) per policy (rows) and load level (columns).
func (sw *Sweep) WriteLoadTable(w io.Writer) {
	fmt.Fprint(w, "| policy |")
	for _, lv := range sw.Levels {
		fmt.Fprintf(w, " %s p50 / p90 ms |", LevelName(lv.RateScale))
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "|---|")
	for range sw.Levels {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, name := range sw.PolicyNames() {
		fmt.Fprintf(w, "| %s |", name)
		for _, lv := range sw.Levels {
			if p := lv.Result.Find(name); p != nil && len(p.TTFT) > 0 {
				fmt.Fprintf(w, " %s / %s |", ms(Percentile(p.TTFT, 50)), ms(Percentile(p.TTFT, 90)))
			} else {
				fmt.Fprint(w, " - |")
			}
		}
		fmt.Fprintln(w)
	}
}

// PolicyNames lists the policies that ran at any level, in first-seen order.
func (sw *Sweep) PolicyNames() []string {
	var names []string
	for _, lv := range sw.Levels {
		for _, p := range lv.Result.Policies {
			if !slices.Contains(names, p.Policy) {
				names = append(names, p.Policy)
			}
		}
	}
	return names
}

// policyLegend says what each standard policy runs.
const policyLegend = "Policies: rr = `-select rr -kv-mode off`; chwbl = `-select chwbl -kv-mode off`; " +
	"kv-exact = `-kv-mode 3` with every other default (the cost policy: least predicted TTFT); " +
	"kv-exact-overlap / kv-exact-prefix = `-kv-mode 3 -kv-policy overlap -kv-score overlap|prefix` (the argmax; misses fall back to rr); " +
	"oracle = the harness places each request on the engine with the least predicted TTFT under the simulator's own latency model " +
	"(FCFS admission for a batch slot and KV blocks, then prefill of the uncached tokens), knowing every engine's cache (Sim.ProbeBody), " +
	"free blocks and queue (ties: least loaded, then rotation), no kvgate; it is greedy per request."

// WriteTargets states the TTFT targets against this run when the policies are there:
// the default KV-Exact (kv-exact; else the overlap or prefix argmax) against rr, chwbl and
// the oracle.
func (r *Result) WriteTargets(w io.Writer) {
	rr, ch, or := r.Find("rr"), r.Find("chwbl"), r.Find("oracle")
	var kv *PolicyResult
	for _, n := range []string{"kv-exact", "kv-exact-overlap", "kv-exact-prefix"} {
		if kv = r.Find(n); kv != nil && len(kv.TTFT) > 0 {
			break
		}
	}
	if rr == nil || kv == nil || len(rr.TTFT) == 0 || len(kv.TTFT) == 0 {
		return
	}
	fmt.Fprintln(w, "Targets:")
	fmt.Fprintln(w)
	ratio := float64(Percentile(kv.TTFT, 90)) / float64(Percentile(rr.TTFT, 90))
	fmt.Fprintf(w, "- %s TTFT p90 / rr TTFT p90 = %.2f (target <= 0.30 where prefixes are shared): %s\n", kv.Policy, ratio, verdict(ratio <= 0.3))
	if ch != nil && len(ch.TTFT) > 0 {
		for _, p := range []float64{50, 90} {
			best := min(Percentile(rr.TTFT, p), Percentile(ch.TTFT, p))
			fmt.Fprintf(w, "- %s TTFT p%.0f %s ms vs the better of rr and chwbl %s ms (target: no worse): %s\n", kv.Policy, p,
				ms(Percentile(kv.TTFT, p)), ms(best), verdict(Percentile(kv.TTFT, p) <= best))
		}
	}
	if or != nil && len(or.TTFT) > 0 {
		for _, p := range []float64{50, 90} {
			q := float64(Percentile(kv.TTFT, p)) / float64(max(Percentile(or.TTFT, p), 1))
			fmt.Fprintf(w, "- %s TTFT p%.0f / oracle's = %.2f (target <= 1.15): %s\n", kv.Policy, p, q, verdict(q <= 1.15))
		}
	}
	if or != nil && or.HitRatio() > 0 {
		q := kv.HitRatio() / or.HitRatio()
		fmt.Fprintf(w, "- %s delivered hit ratio / oracle's = %.2f (target >= 0.90): %s\n", kv.Policy, q, verdict(q >= 0.9))
	}
	fmt.Fprintln(w)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
