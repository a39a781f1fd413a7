//go:build !kvwired

package proxy

import (
	"context"
	"errors"

	"github.com/kvgate/kvgate/shard"
)

// kvRouter is a placeholder until tokenize and ingest land (build with -tags kvwired).
type kvRouter struct{}

func newKVRouter(*Server) (*kvRouter, error) {
	return nil, &FlagError{Flag: "-kv-mode", Msg: "KV-Exact is not built into this binary yet"}
}

func (k *kvRouter) start(context.Context) error            { return errors.New("unreachable") }
func (k *kvRouter) close()                                 {}
func (k *kvRouter) route(*reqState, shard.Mask, *decision) {}
func (k *kvRouter) inventory(i int) (keys int, parity string, connected bool, lastSeq int64) {
	return 0, "unknown", false, -1
}
func (k *kvRouter) explain(st *reqState, el shard.Mask, d *decision) (tokens, blocks int) {
	k.route(st, el, d)
	return 0, 0
}
func (k *kvRouter) loaded() bool { return true }
