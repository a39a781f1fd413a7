package enginepub

import (
	"strconv"
	"sync"
)

// TRTBlock is one block of a TensorRT-LLM "stored" event.
type TRTBlock struct {
	Hash       uint64
	Tokens     []uint32
	CacheLevel int
	Priority   int
}

type trtEvent struct {
	id      int64
	kind    string
	parent  uint64
	hasPar  bool
	blocks  []TRTBlock
	hashes  []uint64
	levels  []int
	oldLvl  int
	newLvl  int
	dpRank  int
	hasRank bool
}

// TRTQueue is TensorRT-LLM's KV event buffer as trtllm-serve exposes it: events queue up
// until a POST /kv_cache_events drains them all. Safe for concurrent use.
type TRTQueue struct {
	mu         sync.Mutex
	next       int64
	events     []trtEvent
	WindowSize int // window_size written on every event (default 0)
	DPRank     int // attention_dp_rank, written when HasDPRank
	HasDPRank  bool
}

func (q *TRTQueue) push(e trtEvent) {
	q.mu.Lock()
	e.id = q.next
	q.next++
	e.dpRank, e.hasRank = q.DPRank, q.HasDPRank
	q.events = append(q.events, e)
	q.mu.Unlock()
}

// Created queues the "created" event a KV cache manager emits on start.
func (q *TRTQueue) Created(numBlocksPerCacheLevel ...int) {
	q.push(trtEvent{kind: "created", levels: append([]int(nil), numBlocksPerCacheLevel...)})
}

// Stored queues a "stored" event; hasParent=false writes a null parent_hash.
func (q *TRTQueue) Stored(parent uint64, hasParent bool, blocks ...TRTBlock) {
	q.push(trtEvent{kind: "stored", parent: parent, hasPar: hasParent, blocks: append([]TRTBlock(nil), blocks...)})
}

// Removed queues a "removed" event.
func (q *TRTQueue) Removed(hashes ...uint64) {
	q.push(trtEvent{kind: "removed", hashes: append([]uint64(nil), hashes...)})
}

// Updated queues an "updated" event moving a block between cache levels.
func (q *TRTQueue) Updated(hash uint64, oldLevel, newLevel int) {
	q.push(trtEvent{kind: "updated", hashes: []uint64{hash}, oldLvl: oldLevel, newLvl: newLevel})
}

// SkipIDs advances event_id by n without queueing anything (lost events: a gap).
func (q *TRTQueue) SkipIDs(n int64) {
	q.mu.Lock()
	q.next += n
	q.mu.Unlock()
}

// ResetIDs restarts event_id at 0 (a restarted server).
func (q *TRTQueue) ResetIDs() {
	q.mu.Lock()
	q.next = 0
	q.mu.Unlock()
}

// Len is the number of queued events.
func (q *TRTQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.events)
}

// Drain appends the JSON body of POST /kv_cache_events to dst and empties the queue.
func (q *TRTQueue) Drain(dst []byte) []byte {
	q.mu.Lock()
	evs := q.events
	q.events = nil
	win := q.WindowSize
	q.mu.Unlock()
	dst = append(dst, '[')
	for i := range evs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendTRTEvent(dst, &evs[i], win)
	}
	return append(dst, ']')
}

func appendTRTEvent(b []byte, e *trtEvent, win int) []byte {
	b = append(b, `{"event_id":`...)
	b = strconv.AppendInt(b, e.id, 10)
	b = append(b, `,"data":{"type":"`...)
	b = append(b, e.kind...)
	b = append(b, '"')
	switch e.kind {
	case "created":
		b = append(b, `,"num_blocks_per_cache_level":[`...)
		for i, n := range e.levels {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(n), 10)
		}
		b = append(b, ']')
	case "stored":
		b = append(b, `,"parent_hash":`...)
		if e.hasPar {
			b = strconv.AppendUint(b, e.parent, 10)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"blocks":[`...)
		for i, blk := range e.blocks {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"type":"stored_block","block_hash":`...)
			b = strconv.AppendUint(b, blk.Hash, 10)
			b = append(b, `,"tokens":[`...)
			for j, t := range blk.Tokens {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, `{"type":"unique_token","token_id":`...)
				b = strconv.AppendUint(b, uint64(t), 10)
				b = append(b, `,"token_extra_id":0}`...)
			}
			b = append(b, `],"lora_id":null,"cache_level":`...)
			b = strconv.AppendInt(b, int64(blk.CacheLevel), 10)
			b = append(b, `,"priority":`...)
			b = strconv.AppendInt(b, int64(blk.Priority), 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	case "removed":
		b = append(b, `,"block_hashes":[`...)
		for i, h := range e.hashes {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, h, 10)
		}
		b = append(b, ']')
	case "updated":
		b = append(b, `,"block_hash":`...)
		b = strconv.AppendUint(b, e.hashes[0], 10)
		b = append(b, `,"cache_level":{"type":"event_diff","new_value":`...)
		b = strconv.AppendInt(b, int64(e.newLvl), 10)
		b = append(b, `,"old_value":`...)
		b = strconv.AppendInt(b, int64(e.oldLvl), 10)
		b = append(b, `},"priority":null`...)
	}
	b = append(b, `},"window_size":`...)
	b = strconv.AppendInt(b, int64(win), 10)
	if e.hasRank {
		b = append(b, `,"attention_dp_rank":`...)
		b = strconv.AppendInt(b, int64(e.dpRank), 10)
	}
	return append(b, '}')
}
