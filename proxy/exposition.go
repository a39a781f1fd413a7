package proxy

import (
	"bytes"
	"io"
	"strconv"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// /metrics is Prometheus text format 0.0.4: every family once, with # HELP and # TYPE.
// VictoriaMetrics/metrics writes TYPE and an empty HELP when metadata is on; withHelp
// fills the HELP text in from familyHelp. Families kvgate writes itself (gauges read at
// scrape time) go through famWriter, which writes their metadata once per family.
func init() { metrics.ExposeMetadata(true) }

// familyHelp documents every kvgate family. A family missing here still gets a HELP
// line (its name), and the exposition test fails so it gets a real one.
var familyHelp = map[string]string{
	"kvgate_requests_total":                      "Requests forwarded to an endpoint, by routing decision.",
	"kvgate_responses_total":                     "Answers relayed from an endpoint to the client, by routing decision and status code.",
	"kvgate_request_duration_seconds":            "Time from the request's arrival to the end of the relayed answer.",
	"kvgate_ttft_seconds":                        "Time from the request's arrival to the first response body byte relayed (for streams, the first event).",
	"kvgate_kv_hits_total":                       "KV-Exact decisions that chose an endpoint holding the prompt's blocks.",
	"kvgate_kv_misses_total":                     "KV-Exact misses routed by the rule's selector, by reason.",
	"kvgate_predicted_cached_tokens_total":       "Prompt tokens kvgate predicted cached on the chosen endpoint (receipted requests).",
	"kvgate_delivered_cached_tokens_total":       "Cached prompt tokens the engine reported (usage.prompt_tokens_details.cached_tokens).",
	"kvgate_delivery_receipts_total":             "Responses that carried usage.prompt_tokens_details.",
	"kvgate_delivered_prompt_tokens_total":       "Prompt tokens the engine reported in receipted responses.",
	"kvgate_upstream_errors_total":               "Failures talking to an endpoint, by kind.",
	"kvgate_bad_requests_total":                  "Requests refused before any engine saw them, by reason.",
	"kvgate_route_stage_seconds":                 "Time per routing stage (parse, tokenize, hash, score, select).",
	"kvgate_route_seconds":                       "Routing overhead of a request's first decision (parse to selection).",
	"kvgate_kv_next_best_total":                  "KV hits that went to the next-best endpoint because the best was over its load bound.",
	"kvgate_retries_total":                       "Requests sent again to another endpoint after a failure.",
	"kvgate_no_healthy_endpoint_total":           "Requests answered 502/503 because no endpoint could take them.",
	"kvgate_unknown_model_total":                 "KV-Exact requests naming a model with no tokenizer.",
	"kvgate_session_affinity_hits_total":         "Mode-1 requests routed by session affinity.",
	"kvgate_client_disconnects_total":            "Requests whose client went away before the answer ended.",
	"kvgate_unauthorized_total":                  "Public requests answered 401: no or an unknown API key (-api-keys-file).",
	"kvgate_inflight_requests":                   "Requests in flight to an endpoint.",
	"kvgate_breaker_state":                       "Circuit breaker state: 0 closed, 1 open, 2 half-open.",
	"kvgate_endpoint_up":                         "1 when the endpoint is healthy and not administratively down.",
	"kvgate_endpoint_admin_down":                 "1 when the endpoint was drained through /admin/endpoints/{name}/down.",
	"kvgate_routing_state":                       "1 for the endpoint's current KV routing state (off, exact, degraded).",
	"kvgate_routing_degraded":                    "1 for each reason that currently degrades the endpoint's KV routing.",
	"kvgate_kv_zero_hit_alarm":                   "1 while KV-Exact misses every request although the inventory is populated (a contract problem).",
	"kvgate_ready":                               "1 when /readyz answers 200.",
	"kvgate_inventory_memory_bytes":              "Bytes the block inventory holds.",
	"kvgate_inventory_unique_keys":               "Distinct block keys in the inventory.",
	"kvgate_inventory_slots":                     "Hash table slots of the inventory.",
	"kvgate_inventory_tombstones":                "Deleted slots not yet reclaimed.",
	"kvgate_inventory_max_keys_per_endpoint":     "The per-endpoint key bound (-kv-max-keys-per-endpoint).",
	"kvgate_inventory_evicted_total":             "Keys evicted at the per-endpoint bound.",
	"kvgate_inventory_dropped_total":             "Keys not added at the per-endpoint bound.",
	"kvgate_inventory_rebuilds_total":            "Inventory table rebuilds.",
	"kvgate_inventory_compactions_dropped_total": "Background table compactions given up (writers outran the copy, or a whole-shard change came during it); a rebuild under the shard's lock took over.",
	"kvgate_prefix_trie_keys":                    "Block keys of prompts kvgate sent, remembered per endpoint (mode 1's prefix trie, mode 3's pending entries).",
	"kvgate_prefix_trie_memory_bytes":            "Bytes the prefix trie or pending entries hold.",
	"kvgate_tokenize_memo_hits_total":            "Text segments between special tokens whose token IDs came from the tokenization memo.",
	"kvgate_tokenize_memo_misses_total":          "Text segments the tokenization memo did not hold (tokenized and stored).",
	"kvgate_tokenize_memo_notes_total":           "Replayed chat template iterations whose token IDs came whole from their note in the render memo (their segments count as hits).",
	"kvgate_tokenize_memo_evictions_total":       "Segments evicted from the tokenization memo at its bound (-tokenize-memo-bytes).",
	"kvgate_tokenize_memo_bytes":                 "Bytes the tokenization memo holds.",
	"kvgate_render_memo_hits_total":              "Chat template loop iterations replayed and messages bound from the render memo.",
	"kvgate_render_memo_misses_total":            "Loop iterations evaluated and messages bound that the render memo did not hold (stored).",
	"kvgate_render_memo_evictions_total":         "Entries evicted from the render memo at its bound (-render-memo-bytes).",
	"kvgate_render_memo_bytes":                   "Bytes the render memo holds.",
	"kvgate_chain_memo_hit_blocks_total":         "Block keys taken from the chain memo (hashed by an earlier request of the same prefix).",
	"kvgate_chain_memo_miss_blocks_total":        "Block keys the chain memo did not hold (hashed under the engine's contract).",
	"kvgate_chain_memo_evictions_total":          "Chain stretches evicted from the chain memo at its bound (-kv-chain-memo-bytes).",
	"kvgate_chain_memo_bytes":                    "Bytes the chain memo holds.",
	"kvgate_engine_load_scrape_errors_total":     "Engine /metrics reads that failed or held no running/waiting gauge (the cost policy then uses kvgate's own accounting).",
	"kvgate_engine_load_report_fresh":            "1 while the endpoint's last engine load report is within 3 -kv-load-scrape intervals.",
	"kvgate_tokenizer_memory_bytes":              "Bytes a loaded tokenizer holds.",
	"kvgate_affinity_sessions":                   "Mode-1 session affinity entries.",
	"kvgate_fleet_changes_total":                 "Fleet changes (endpoints file, admin API, DNS answers, SIGHUP), by source and result (applied, refused).",
	"kvgate_fleet_slots_free":                    "Endpoint slots free for endpoints added at runtime (-max-endpoints).",
	"kvgate_fleet_endpoints_draining":            "Removed endpoints still finishing their in-flight requests.",
	"kvgate_fleet_change_refused":                "1 while the last fleet change was refused: the running endpoints differ from their sources.",
	"kvgate_ingest_reconnects_total":             "Event subscriber reconnects.",
	"kvgate_ingest_dial_failures_total":          "Failed dials to the endpoint's event publisher.",
	"kvgate_ingest_batches_total":                "Event batches received.",
	"kvgate_ingest_replayed_batches_total":       "Event batches fetched from the engine's replay socket.",
	"kvgate_ingest_events_total":                 "KV events applied, by type.",
	"kvgate_ingest_keys_added_total":             "Block keys added to the inventory.",
	"kvgate_ingest_keys_removed_total":           "Block keys removed from the inventory.",
	"kvgate_ingest_gaps_total":                   "Event sequence gaps, by action (kept, cleared, filled).",
	"kvgate_ingest_clears_total":                 "Endpoint inventory clears, by reason.",
	"kvgate_ingest_decode_errors_total":          "Event messages that could not be decoded.",
	"kvgate_ingest_topic_skipped_total":          "Event messages skipped for another topic.",
	"kvgate_ingest_duplicate_batches_total":      "Live batches already applied from a replay.",
	"kvgate_ingest_protocol_errors_total":        "Event-socket dials and connections that broke the ZMTP protocol (not a ZMTP 3.x PUB, malformed or oversize frames).",
	"kvgate_ingest_event_lag_seconds":            "Live event batches from the engine's publish (the batch's ts, the engine's wall clock) to applied in kvgate's inventory; across hosts it includes the clocks' offset.",
	"kvgate_ingest_parity_checks_total":          "Parity attestations of engine keys against the rule's contract, by result.",
	"kvgate_ingest_orphan_events_total":          "BlockStored events whose parent block is unknown.",
	"kvgate_ingest_unkeyable_events_total":       "BlockStored events kvgate could not key.",
	"kvgate_plane_ingest_published_total":        "Inventory operations this ingest replica published to the event plane.",
	"kvgate_plane_ingest_messages_total":         "Event-plane messages per endpoint, by result (published, dropped, failed_ack).",
	"kvgate_plane_ingest_snapshots_total":        "Inventory snapshots this ingest replica published per endpoint.",
	"kvgate_plane_ingest_connected":              "1 while this ingest replica is connected to the NATS event plane.",
	"kvgate_reload_refused":                      "1 while a reloaded file (tls: -tls-cert/-tls-key, api_keys: -api-keys-file) failed to load and its previous version is in use.",
	"kvgate_plane_ingest_publishing":             "1 while this ingest replica's events reach the plane's stream (connected, and the stream exists).",
	"kvgate_plane_route_messages_total":          "Event-plane messages this route replica consumed per endpoint, by result (applied, ignored, bad).",
	"kvgate_plane_route_gaps_total":              "Sequence gaps seen in an endpoint's plane stream (each asks for a snapshot).",
	"kvgate_plane_route_snapshots_total":         "Snapshots this route replica applied per endpoint.",
	"kvgate_plane_route_snapshot_requests_total": "Snapshots this route replica asked the ingest replica for.",
	"kvgate_plane_route_reconciles_total":        "Snapshots that changed this route replica's keys for an endpoint.",
	"kvgate_plane_route_dual_ingest_total":       "Messages from a second ingest replica publishing the same endpoint (a misconfiguration).",
	"kvgate_plane_route_state":                   "Event-plane state per endpoint on a route replica (0 ok, 1 syncing, 2 degraded).",
	"kvgate_plane_route_connected":               "1 while this route replica is connected to the NATS event plane.",
	"kvgate_ingest_bad_events_total":             "Engine events that could not be decoded and were skipped alone (the rest of their batch applied), by reason.",
	"kvgate_ingest_refcount_evictions_total":     "Holder counts dropped from the bounded per-(hash, tier) table (a later remove of such a hash passes straight through).",
	"kvgate_ingest_connected":                    "1 when every rank's event subscriber is connected.",
	"kvgate_ingest_parity":                       "Parity state: 0 unknown, 1 ok, 2 mismatch.",
	"kvgate_ingest_rehash":                       "1 when the endpoint's inventory holds kvgate's re-hashed keys.",
	"kvgate_ingest_inventory_keys":               "Block keys the endpoint holds in the inventory.",
	"kvgate_ingest_tier_blocks":                  "Blocks the engine reported per cache tier.",
}

// famWriter writes one family's metadata, then its samples.
type famWriter struct{ w io.Writer }

func (f famWriter) family(name, typ string) {
	io.WriteString(f.w, "# HELP "+name+"\n# TYPE "+name+" "+typ+"\n") //nolint:errcheck
}

func (f famWriter) sample(name, labels string, v uint64) {
	b := make([]byte, 0, len(name)+len(labels)+24)
	b = append(b, name...)
	if labels != "" {
		b = append(b, '{')
		b = append(b, labels...)
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = strconv.AppendUint(b, v, 10)
	b = append(b, '\n')
	f.w.Write(b) //nolint:errcheck
}

// gauge writes a one-sample gauge family.
func (f famWriter) gauge(name string, v uint64) {
	f.family(name, "gauge")
	f.sample(name, "", v)
}

func (f famWriter) counter(name string, v uint64) {
	f.family(name, "counter")
	f.sample(name, "", v)
}

// incompleteHistograms are VictoriaMetrics' Go runtime histograms, written without
// _sum and _count (the runtime keeps no exact sum): Prometheus histograms need both, so
// they are left out rather than exposed malformed.
var incompleteHistograms = [...]string{"go_sched_latencies_seconds", "go_gc_pauses_seconds"}

func incomplete(line []byte) bool {
	if bytes.HasPrefix(line, []byte("# ")) {
		if f := bytes.Fields(line); len(f) >= 3 {
			line = f[2]
		}
	}
	for _, n := range incompleteHistograms {
		if bytes.HasPrefix(line, []byte(n)) {
			rest := line[len(n):]
			if len(rest) == 0 || rest[0] == ' ' || rest[0] == '{' || bytes.HasPrefix(rest, []byte("_bucket")) {
				return true
			}
		}
	}
	return false
}

// withHelp copies the exposition in b to w with each empty # HELP line given its text.
func withHelp(w io.Writer, b []byte) {
	var out bytes.Buffer
	out.Grow(len(b) + len(b)/8)
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i+1], b[i+1:]
		} else {
			b = nil
		}
		if line[0] == 'g' || line[0] == '#' {
			if incomplete(line) {
				continue
			}
		}
		name, ok := bytes.CutPrefix(bytes.TrimRight(line, "\n"), []byte("# HELP "))
		if !ok || bytes.IndexByte(name, ' ') >= 0 {
			out.Write(line)
			continue
		}
		out.Write(bytes.TrimRight(line, "\n"))
		out.WriteByte(' ')
		out.WriteString(helpFor(string(name)))
		out.WriteByte('\n')
	}
	w.Write(out.Bytes()) //nolint:errcheck
}

func helpFor(name string) string {
	if h, ok := familyHelp[name]; ok {
		return h
	}
	switch {
	case strings.HasPrefix(name, "go_"):
		return "Go runtime metric " + name + "."
	case strings.HasPrefix(name, "process_"):
		return "Process metric " + name + "."
	}
	return name + " (undocumented)"
}
