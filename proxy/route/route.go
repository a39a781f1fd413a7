// Package route holds kvgate's KV-Exact selection policies: given the endpoints that may
// take a request and how many of its prompt's blocks each one holds, pick one. Each policy
// is a small type behind Selector; its inputs are explicit values (Candidates, the loads
// and queues it was built with), never the server. /debug/explain and traffic run the same
// Select; an Observer, when given, records every endpoint's terms and the verdict.
package route

import (
	"github.com/kvgate/kvgate/shard"
)

// Candidates are the request facts a selector decides from.
type Candidates struct {
	// Eligible are the endpoints that may take the request (healthy, not excluded, not
	// admin-down, breaker closed, of the right role).
	Eligible shard.Mask
	// Matched is the number of the prompt's blocks each endpoint holds (index by
	// endpoint; 0 where it holds none or is not eligible).
	Matched []int32
	// Best is the eligible endpoint with the most matched blocks (Matched[Best] > 0).
	Best int
	// Tokens is the prompt's length in tokens, BlockSize the engines' block size.
	Tokens, BlockSize int
	// MinBlocks is the shallowest match that counts as a hit (-kv-min-match-tokens).
	MinBlocks int32
	// Key is the request's content key for CHWBL (model + system message or prompt head).
	Key uint64
	// Blocks are the prompt's chained block keys (any one chain), for Popularity.
	Blocks []uint64
	// CPU and Storage, when set, are how many of Matched[i]'s blocks only a lower tier
	// holds (host memory; disk or a remote store): the engine loads them instead of
	// prefilling them, at CPUCost and StorageCost of an uncached token's prefill each
	// (-kv-tier-weight-cpu, -kv-tier-weight-storage).
	CPU, Storage         []int32
	CPUCost, StorageCost float64
}

// Uncached is the prefill work candidate i leaves, in uncached-token equivalents: the
// prompt past its match, plus its lower-tier blocks at their tiers' cost. A match under
// MinBlocks counts as none (the engine may well not reuse it).
func (c *Candidates) Uncached(i int) int {
	m := c.Matched[i]
	if m < c.MinBlocks {
		return c.Tokens
	}
	u := float64(max(c.Tokens-int(m)*c.BlockSize, 0))
	if c.CPU != nil {
		u += float64(int(c.CPU[i])*c.BlockSize)*c.CPUCost + float64(int(c.Storage[i])*c.BlockSize)*c.StorageCost
	}
	return int(u + 0.5)
}

// Terms are one endpoint's inputs to a cost decision, as /debug/explain shows them.
type Terms struct {
	Matched int32 `json:"matched_blocks"`           // blocks of the prompt the endpoint holds (any tier)
	CPU     int32 `json:"cpu_blocks,omitempty"`     // of those, held only in host memory
	Storage int32 `json:"storage_blocks,omitempty"` // held only on disk or a remote store
	// The prompt tokens of the match each tier serves (the GPU's come first).
	GPUTokens     int     `json:"gpu_tokens"`
	CPUTokens     int     `json:"cpu_tokens,omitempty"`
	StorageTokens int     `json:"storage_tokens,omitempty"`
	Uncached      int     `json:"uncached_tokens"`       // prompt tokens it would have to prefill
	Queued        int64   `json:"queued_prefill_tokens"` // sent by kvgate, no first token yet
	Ahead         int64   `json:"ahead"`                 // requests predicted to wait for a batch slot ahead
	InFlight      int64   `json:"in_flight"`             // requests kvgate has in flight there
	Rate          float64 `json:"prefill_tokens_per_s"`  // learned or pinned
	Predicted     float64 `json:"predicted_ttft_ms"`
	Waiting       int64   `json:"awaiting_first_token"` // requests kvgate sent there with no first byte yet
	Delays        float64 `json:"delays_others_ms"`     // Waiting x this prefill: what it costs them
	Cost          float64 `json:"cost_ms"`              // Predicted + Delays: what the policy minimizes
	Source        string  `json:"load_source"`          // "engine" (a fresh /metrics report) or "kvgate" (its own accounting)
	Share         float64 `json:"work_share"`           // its share of the recent prefill work, with this request's
	OverShare     bool    `json:"over_fair_share"`      // the share passes FairShare x the mean
	Followers     int64   `json:"prefix_followers"`     // recent requests that carried its cached prefix
}

// Observer records a decision's inputs. Traffic passes nil.
type Observer interface {
	Endpoint(ep int, t Terms)
}

// Selector picks one eligible endpoint. The KV-Exact policies (Cost, Overlap) read the
// matched blocks and return -1 when no eligible endpoint is acceptable (the caller falls
// back to the rule's selector and counts kv-miss:no_worker); the rule's selectors (RR,
// CHWBL) read only the eligible set and the content key.
type Selector interface {
	Select(c *Candidates, obs Observer) int
	// Name is the policy's -kv-policy value.
	Name() string
}

// rotatedStart is where a scan over n candidates, c of them eligible, starts on turn: the
// turn-th eligible one, cyclically, so ties rotate evenly over the eligible candidates.
// Rotating over all n slots instead would hand every turn that starts in a run of ineligible slots (a fleet's
// vacant ones, drained or down endpoints) to the eligible candidate after the run.
func rotatedStart(el shard.Mask, n, c int, turn uint64) int {
	if c == 0 {
		return 0
	}
	k := int(turn % uint64(c))
	for i := 0; i < n; i++ {
		if el.Has(i) {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return 0
}
