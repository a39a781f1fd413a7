package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// AtRate is the workload with its arrival rate multiplied by f: every arrival time and
// every think time divided by f (rate x2 = inter-arrival /2). Sessions share their prompts
// with w.
func (w Workload) AtRate(f float64) Workload {
	if f <= 0 || f == 1 {
		return w
	}
	out := Workload{Name: w.Name, Sessions: make([]Session, len(w.Sessions))}
	for i, s := range w.Sessions {
		s.At = time.Duration(float64(s.At) / f)
		s.Think = time.Duration(float64(s.Think) / f)
		out.Sessions[i] = s
	}
	return out
}

// ParseRateScales reads a -rate-scale list: comma-separated positive multipliers.
func ParseRateScales(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0) || v > 1e6 {
			return nil, fmt.Errorf("-rate-scale %q: %q is not a positive number", s, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// Level is one load level of a sweep: the arrival-rate multiplier and what each policy did.
type Level struct {
	RateScale float64
	Requests  int
	Span      time.Duration // arrival of the last session at this rate
	Result    *Result
}

// Sweep is one workload run at several load levels.
type Sweep struct {
	Workload string
	Levels   []Level
}

// RunSweep runs cfg's workload at each arrival-rate multiplier in turn (every policy per
// level, each against fresh engines). A level that fails is kept with what completed.
// before (when set) is called as a level starts, after with each level's results.
func RunSweep(ctx context.Context, cfg Config, scales []float64, before func(rateScale float64, w *Workload), after func(*Level)) (*Sweep, error) {
	if len(scales) == 0 {
		scales = []float64{1}
	}
	base := cfg.Workload
	sw := &Sweep{Workload: base.Name}
	var errs []error
	for _, f := range scales {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		cfg.Workload = base.AtRate(f)
		if before != nil {
			before(f, &cfg.Workload)
		}
		res, err := Run(ctx, cfg)
		if err != nil {
			errs = append(errs, fmt.Errorf("rate %s: %w", LevelName(f), err))
		}
		if res != nil && len(res.Policies) > 0 {
			sw.Levels = append(sw.Levels, Level{RateScale: f, Requests: cfg.Workload.Requests(), Span: cfg.Workload.Span(), Result: res})
			if after != nil {
				after(&sw.Levels[len(sw.Levels)-1])
			}
		}
	}
	return sw, errors.Join(errs...)
}

// LevelName is how reports and file names call a level: "x0.5", "x2".
func LevelName(f float64) string { return "x" + strconv.FormatFloat(f, 'g', -1, 64) }
