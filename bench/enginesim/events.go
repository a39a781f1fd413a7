package enginesim

import (
	"sync"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// ZMQSink publishes the pool's events on a ZeroMQ PUB socket (plus replay ROUTER) in an
// engine's wire format. Publishing happens on its own goroutine, in order, so a slow
// subscriber never stalls the pool's lock.
type ZMQSink struct {
	Pub  *enginepub.Publisher
	ch   chan []enginepub.Event
	done chan struct{}

	mu     sync.RWMutex // closed and ch's closing: a late request must not send on a closed channel
	closed bool
}

// NewZMQSink listens per cfg and starts the publishing goroutine.
func NewZMQSink(cfg enginepub.Config) (*ZMQSink, error) {
	pub, err := enginepub.New(cfg)
	if err != nil {
		return nil, err
	}
	z := &ZMQSink{Pub: pub, ch: make(chan []enginepub.Event, 4096), done: make(chan struct{})}
	go z.run()
	return z, nil
}

func (z *ZMQSink) run() {
	defer close(z.done)
	for evs := range z.ch {
		_ = z.Pub.Publish(evs...)
	}
}

// Publish converts one pool batch into one engine batch.
func (z *ZMQSink) Publish(evs []Event) {
	out := make([]enginepub.Event, 0, len(evs))
	for i := range evs {
		e := &evs[i]
		switch e.Kind {
		case Stored:
			out = append(out, enginepub.BlockStored{Hashes: append([]uint64(nil), e.Keys...), Parent: e.Parent,
				HasParent: e.HasParent, TokenIDs: append([]uint32(nil), e.Tokens...), BlockSize: e.BlockSize, LoRAName: e.LoRAName})
		case Removed:
			out = append(out, enginepub.BlockRemoved{Hashes: append([]uint64(nil), e.Keys...)})
		case Cleared:
			out = append(out, enginepub.AllBlocksCleared{})
		}
	}
	z.mu.RLock()
	if !z.closed {
		z.ch <- out
	}
	z.mu.RUnlock()
}

// Close flushes queued batches and closes the sockets. Events published afterwards are
// dropped (the engine is shutting down).
func (z *ZMQSink) Close() error {
	z.mu.Lock()
	if z.closed {
		z.mu.Unlock()
		return nil
	}
	z.closed = true
	close(z.ch)
	z.mu.Unlock()
	<-z.done
	return z.Pub.Close()
}

// SGLangSink splits stored runs into one BlockStored per page, as SGLang emits them.
type SGLangSink struct{ *ZMQSink }

// Publish emits one BlockStored per page.
func (s SGLangSink) Publish(evs []Event) {
	var split []Event
	for _, e := range evs {
		if e.Kind != Stored || len(e.Keys) <= 1 {
			split = append(split, e)
			continue
		}
		parent, has := e.Parent, e.HasParent
		for j, k := range e.Keys {
			split = append(split, Event{Kind: Stored, Keys: []uint64{k}, Parent: parent, HasParent: has,
				Tokens: e.Tokens[j*e.BlockSize : (j+1)*e.BlockSize], BlockSize: e.BlockSize, LoRAName: e.LoRAName})
			parent, has = k, true
		}
	}
	s.ZMQSink.Publish(split)
}

// TRTSink queues events the TensorRT-LLM way, drained by POST /kv_cache_events. The
// simulator's block keys serve as TensorRT-LLM's block hashes (a router re-hashes the
// tokens into its own keys anyway).
type TRTSink struct {
	Q *enginepub.TRTQueue
}

// Publish queues one TensorRT-LLM event per pool event.
func (t *TRTSink) Publish(evs []Event) {
	for _, e := range evs {
		switch e.Kind {
		case Stored:
			blocks := make([]enginepub.TRTBlock, len(e.Keys))
			for j, k := range e.Keys {
				blocks[j] = enginepub.TRTBlock{Hash: k, Tokens: append([]uint32(nil), e.Tokens[j*e.BlockSize:(j+1)*e.BlockSize]...)}
			}
			t.Q.Stored(e.Parent, e.HasParent, blocks...)
		case Removed:
			t.Q.Removed(e.Keys...)
		case Cleared:
			// TensorRT-LLM has no "cleared" event: report every cached block removed is not
			// possible here, so emit nothing; its reuse is reset only on restart.
		}
	}
}
