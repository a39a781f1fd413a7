package bench

import (
	"fmt"
	"io"
	"path/filepath"
	"runtime"
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
	fmt.Fprintf(w, "Machine: %d CPUs (GOMAXPROCS %d), %s %s/%s. Engines run in the harness process; kvgate is a child process.\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	s := r.Sim
	fmt.Fprintf(w, "Engine model: %s, block size %d, %d KV blocks, batch %d; prefill = %v + %v x uncached token; decode %v per output token.\n\n",
		orDefault(s.Engine, "vllm"), s.BlockSize, s.NumBlocks, s.MaxBatch, s.PrefillBase, s.PrefillPerToken, s.DecodePerToken)
	if len(r.KvgateArgs) > 0 {
		fmt.Fprintf(w, "kvgate flags added to every kvgate policy: `%s`.\n\n", strings.Join(r.KvgateArgs, " "))
	}
	fmt.Fprintln(w, policyLegend)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "## Comparison")
	fmt.Fprintln(w)
	r.WriteTable(w)
	fmt.Fprintln(w)
	r.WriteTargets(w)
	fmt.Fprintln(w, "## Load per endpoint")
	fmt.Fprintln(w)
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
	var errs []string
	for _, p := range r.Policies {
		if p.FirstErr != "" {
			errs = append(errs, fmt.Sprintf("- %s: %d errors, first: `%s`", p.Policy, p.Errors, strings.ReplaceAll(p.FirstErr, "`", "'")))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintln(w, "## Errors")
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.Join(errs, "\n"))
		fmt.Fprintln(w)
	}
	if len(plots) > 0 {
		fmt.Fprintln(w, "## Plots")
		fmt.Fprintln(w)
		for _, p := range plots {
			fmt.Fprintf(w, "![%s](%s)\n\n", strings.TrimSuffix(p, filepath.Ext(p)), p)
		}
	}
	fmt.Fprintln(w, "Delivered hit ratio = sum of usage.prompt_tokens_details.cached_tokens / sum of prompt_tokens over")
	fmt.Fprintln(w, "successful requests, as the engines reported them. Load imbalance = the busiest engine's prefill")
	fmt.Fprintln(w, "work (uncached prompt tokens) over the mean (1.00 = even).")
}

// policyLegend says what each standard policy runs.
const policyLegend = "Policies: rr = `-select rr -kv-mode off`; chwbl = `-select chwbl -kv-mode off`; " +
	"kv-exact = `-kv-mode 3` with every other default (the cost policy: least predicted TTFT); " +
	"kv-exact-overlap / kv-exact-prefix = `-kv-mode 3 -kv-policy overlap -kv-score overlap|prefix` (the argmax; misses fall back to rr); " +
	"oracle = the harness places each request on the engine with the least predicted TTFT under the simulator's own latency model, " +
	"knowing every engine's cache (its /debug/probe) and queue (ties: least loaded, then rotation), no kvgate."

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
