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
	fmt.Fprintln(w, "Policies: rr = `-select rr -kv-mode off`; chwbl = `-select chwbl -kv-mode off`; kv-exact-overlap / kv-exact-prefix = `-kv-mode 3 -kv-score overlap|prefix` (misses fall back to rr); oracle = the harness places each request on the engine whose pool would serve the most of it now (ties: least loaded), no kvgate.")
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

// WriteTargets states the TTFT targets against this run when the policies are there.
func (r *Result) WriteTargets(w io.Writer) {
	rr, kv, ch, or := r.Find("rr"), r.Find("kv-exact-overlap"), r.Find("chwbl"), r.Find("oracle")
	if kv == nil {
		kv = r.Find("kv-exact-prefix")
	}
	if rr == nil || kv == nil || len(rr.TTFT) == 0 || len(kv.TTFT) == 0 {
		return
	}
	fmt.Fprintln(w, "Targets:")
	fmt.Fprintln(w)
	ratio := float64(Percentile(kv.TTFT, 90)) / float64(Percentile(rr.TTFT, 90))
	fmt.Fprintf(w, "- %s TTFT p90 / rr TTFT p90 = %.2f (target <= 0.30): %s\n", kv.Policy, ratio, verdict(ratio <= 0.3))
	if ch != nil && len(ch.TTFT) > 0 {
		fmt.Fprintf(w, "- %s TTFT p90 %s ms vs chwbl %s ms (target: below): %s\n", kv.Policy, ms(Percentile(kv.TTFT, 90)), ms(Percentile(ch.TTFT, 90)),
			verdict(Percentile(kv.TTFT, 90) < Percentile(ch.TTFT, 90)))
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
