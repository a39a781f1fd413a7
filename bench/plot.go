package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlots writes the figures as SVG into dir and returns their file names:
// ttft-cdf.svg (TTFT CDF per policy), hit-ratio.svg (delivered hit ratio per policy) and
// load.svg (prefill work per endpoint per policy).
func (r *Result) WritePlots(dir string) ([]string, error) { return r.WritePlotsAs(dir, "svg") }

// WritePlotsAs is WritePlots in another format gonum/plot supports: svg, png, pdf, eps.
func (r *Result) WritePlotsAs(dir, ext string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return r.writePlots(dir, "", ext)
}

// writePlots writes the three figures with file names prefixed by pre.
func (r *Result) writePlots(dir, pre, ext string) ([]string, error) {
	var names []string
	for _, f := range []struct {
		name string
		make func() (*plot.Plot, error)
	}{
		{pre + "ttft-cdf." + ext, r.ttftCDF},
		{pre + "hit-ratio." + ext, r.hitRatioBars},
		{pre + "load." + ext, r.loadBars},
	} {
		p, err := f.make()
		if err != nil {
			return names, fmt.Errorf("%s: %w", f.name, err)
		}
		if err := p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, f.name)); err != nil {
			return names, fmt.Errorf("%s: %w", f.name, err)
		}
		names = append(names, f.name)
	}
	return names, nil
}

// WriteSweepPlots writes each sweep's figures into dir as ext files: w<i>-ttft-vs-load
// (TTFT p90 and p50 versus the arrival-rate multiplier, one colour per policy) when the
// sweep has more than one level, and w<i>-<level>-{ttft-cdf,hit-ratio,load} per level.
func WriteSweepPlots(dir, ext string, sweeps []*Sweep) ([]SweepPlots, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := make([]SweepPlots, len(sweeps))
	for i, sw := range sweeps {
		pre := fmt.Sprintf("w%d-", i+1)
		if len(sw.Levels) > 1 {
			name := pre + "ttft-vs-load." + ext
			p, err := sw.ttftVsLoad()
			if err == nil {
				err = p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, name))
			}
			if err != nil {
				return out, fmt.Errorf("%s: %w", name, err)
			}
			out[i].Load = name
		}
		for _, lv := range sw.Levels {
			names, err := lv.Result.writePlots(dir, pre+LevelName(lv.RateScale)+"-", ext)
			out[i].Levels = append(out[i].Levels, names)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// ttftVsLoad draws TTFT p90 (solid, with points) and p50 (dashed) per policy against the
// rate multiplier on log axes: the levels are usually geometric (0.5, 1, 2, 4).
func (sw *Sweep) ttftVsLoad() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "TTFT versus load: " + sw.Workload
	p.X.Label.Text = "arrival-rate multiplier (log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = levelTicks(sw.Levels)
	p.Y.Label.Text = "TTFT ms (p90 solid, p50 dashed; log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = ticks125{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	lo, hi := math.Inf(1), 0.0
	for i, name := range sw.PolicyNames() {
		var p90, p50 plotter.XYs
		for _, lv := range sw.Levels {
			if r := lv.Result.Find(name); r != nil && len(r.TTFT) > 0 {
				x := lv.RateScale
				p90 = append(p90, plotter.XY{X: x, Y: max(float64(Percentile(r.TTFT, 90))/float64(time.Millisecond), 0.01)})
				p50 = append(p50, plotter.XY{X: x, Y: max(float64(Percentile(r.TTFT, 50))/float64(time.Millisecond), 0.01)})
			}
		}
		if len(p90) == 0 {
			continue
		}
		for k := range p90 {
			lo, hi = min(lo, p50[k].Y), max(hi, p90[k].Y)
		}
		l, pts, err := plotter.NewLinePoints(p90)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		l.Width = vg.Points(1.8)
		pts.Shape = plotutil.Shape(i)
		l50, err := plotter.NewLine(p50)
		if err != nil {
			return nil, err
		}
		l50.Color = plotutil.Color(i)
		l50.Width = vg.Points(1)
		l50.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l, pts, l50)
		p.Legend.Add(name, l, pts)
	}
	if hi > 0 {
		// Room below for the 1-2-5 tick under the lowest p50, and above for the legend.
		p.Y.Min, p.Y.Max = lo/1.5, hi*4
	}
	return p, nil
}

// levelTicks labels the x axis at the sweep's levels.
type levelTicks []Level

func (lt levelTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for _, lv := range lt {
		ts = append(ts, plot.Tick{Value: lv.RateScale, Label: LevelName(lv.RateScale)})
	}
	return ts
}

func (r *Result) ttftCDF() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "TTFT CDF per policy"
	p.X.Label.Text = "time to first token (ms, log scale)"
	// TTFTs span hits (milliseconds) to cold prefills (hundreds of ms): a log axis shows both.
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ticks125{}
	p.Y.Label.Text = "fraction of requests"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false
	p.Add(plotter.NewGrid())
	for i, pr := range r.Policies {
		if len(pr.TTFT) == 0 {
			continue
		}
		xy := make(plotter.XYs, len(pr.TTFT))
		for j, d := range pr.TTFT {
			xy[j].X = max(float64(d)/float64(time.Millisecond), 0.01)
			xy[j].Y = float64(j+1) / float64(len(pr.TTFT))
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		l.Dashes = plotutil.Dashes(i)
		p.Add(l)
		p.Legend.Add(pr.Policy, l)
	}
	return p, nil
}

func (r *Result) hitRatioBars() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Delivered cache-hit ratio (cached / prompt tokens)"
	p.Y.Label.Text = "hit ratio"
	p.Y.Min, p.Y.Max = 0, 1
	vals := make(plotter.Values, len(r.Policies))
	names := make([]string, len(r.Policies))
	for i, pr := range r.Policies {
		vals[i] = pr.HitRatio()
		names[i] = pr.Policy
	}
	b, err := plotter.NewBarChart(vals, vg.Points(40))
	if err != nil {
		return nil, err
	}
	b.Color = color.RGBA{R: 0x33, G: 0x66, B: 0xcc, A: 0xff}
	p.Add(plotter.NewGrid(), b)
	p.NominalX(names...)
	return p, nil
}

func (r *Result) loadBars() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Prefill work per endpoint (uncached prompt tokens)"
	p.Y.Label.Text = "tokens"
	p.Legend.Top, p.Legend.Left = true, true
	n := len(r.Policies)
	var top float64
	w := vg.Points(float64(60 / max(n, 1)))
	p.Add(plotter.NewGrid())
	for i, pr := range r.Policies {
		vals := make(plotter.Values, r.Engines)
		for j, e := range pr.Endpoints {
			if j < len(vals) {
				vals[j] = float64(e.PromptTokens - e.CachedTokens)
				top = max(top, vals[j])
			}
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(b)
		p.Legend.Add(pr.Policy, b)
	}
	// Headroom above the tallest bar for the legend.
	p.Y.Min, p.Y.Max = 0, top*(1.15+0.08*float64(n))+1
	names := make([]string, r.Engines)
	for i := range names {
		names[i] = fmt.Sprintf("e%d", i)
	}
	p.NominalX(names...)
	return p, nil
}

// ticks125 labels a log axis at 1, 2 and 5 times each power of ten, so short ranges (a few
// milliseconds to a few hundred) still get several labels.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ts
}
