package enginesim

import (
	"context"
	"sync"
)

// scheduler admits requests first-come first-served, like vLLM's FCFS scheduler: at most
// maxBatch run at once, and a request runs only when the pool can hold its blocks. The
// queue's head blocks the requests behind it (no reordering), so "waiting" means what
// vllm:num_requests_waiting means.
type scheduler struct {
	pool     *Pool
	maxBatch int

	mu      sync.Mutex
	running int
	queue   []*pending
}

type pending struct {
	keys   []uint64
	tokens []uint32
	maxNew int
	lora   string
	done   chan struct{} // closed on admission or failure
	alloc  *Alloc
	err    error
	gone   bool // the client left while queued
}

// admit waits until the request may run and returns its blocks.
func (s *scheduler) admit(ctx context.Context, keys []uint64, tokens []uint32, maxNew int, lora string) (*Alloc, error) {
	p := &pending{keys: keys, tokens: tokens, maxNew: maxNew, lora: lora, done: make(chan struct{})}
	s.mu.Lock()
	s.queue = append(s.queue, p)
	s.pumpLocked()
	s.mu.Unlock()
	select {
	case <-p.done:
		return p.alloc, p.err
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case <-p.done: // admitted meanwhile: give the blocks back
			s.mu.Unlock()
			if p.alloc != nil {
				s.finish(p.alloc)
			}
		default:
			p.gone = true
			s.pumpLocked()
			s.mu.Unlock()
		}
		return nil, ctx.Err()
	}
}

// finish releases a running request's blocks and admits whoever can run now.
func (s *scheduler) finish(a *Alloc) {
	s.pool.Release(a)
	s.mu.Lock()
	s.running--
	s.pumpLocked()
	s.mu.Unlock()
}

func (s *scheduler) pumpLocked() {
	for len(s.queue) > 0 {
		p := s.queue[0]
		if p.gone {
			s.queue = s.queue[1:]
			continue
		}
		if s.running >= s.maxBatch {
			return
		}
		a, ok, err := s.pool.Acquire(p.keys, p.tokens, p.maxNew, p.lora)
		if err != nil {
			p.err = err
			s.queue = s.queue[1:]
			close(p.done)
			continue
		}
		if !ok {
			if s.running == 0 {
				// Nothing runs, so nothing will free blocks: only possible when pinned
				// blocks exceed the pool, which Acquire's size check rules out.
				p.err = ErrTooLarge
				s.queue = s.queue[1:]
				close(p.done)
				continue
			}
			return
		}
		p.alloc = a
		s.running++
		s.queue = s.queue[1:]
		close(p.done)
	}
}

func (s *scheduler) load() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.queue {
		if !p.gone {
			waiting++
		}
	}
	return s.running, waiting
}
