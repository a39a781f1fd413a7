package proxy

import (
	"log/slog"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
)

// accessLog writes one structured line for an answered request (-access-log). It is
// off by default: kvgate logs no per-request lines unless asked.
func (s *Server) accessLog(c *app.RequestContext, st *reqState, d *decision, status int, dur, ttft time.Duration) {
	attrs := []slog.Attr{
		slog.String("request_id", string(requestID(c, nil))),
		slog.String("path", string(c.Request.URI().Path())),
		slog.String("endpoint", s.roster().eps[d.ep].spec.Name),
		slog.String("route", d.route.String()),
		slog.Int("status", status),
		slog.Int("predicted_cached_tokens", d.predicted),
		slog.Int64("delivered_cached_tokens", st.cached),
		slog.Float64("ttft_ms", float64(ttft.Microseconds())/1000),
		slog.Float64("duration_ms", float64(dur.Microseconds())/1000),
	}
	if d.prefill > 0 {
		attrs = append(attrs, slog.String("prefill", s.roster().eps[d.prefill-1].spec.Name))
	}
	s.log.LogAttrs(s.ctx, slog.LevelInfo, "request", attrs...)
}
