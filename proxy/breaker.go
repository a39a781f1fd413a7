package proxy

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is a circuit breaker's state as /debug/inventory reports it.
type BreakerState uint8

const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

var breakerNames = [...]string{"closed", "open", "half-open"}

func (s BreakerState) String() string { return breakerNames[s] }

// Breaker stops traffic to an endpoint after consecutive connect failures (or a 5xx
// streak when configured): open for a period, then half-open with a bounded number of
// trial requests, closed again on a trial's success.
type Breaker struct {
	failures  int
	openFor   time.Duration
	trials    int
	now       func() time.Time
	mu        sync.Mutex
	state     BreakerState
	closed    atomic.Bool // state == BreakerClosed, readable without the lock
	clean     atomic.Bool // closed with no failure streak: Success has nothing to do
	streak    int
	openedAt  time.Time
	inTrial   int
	trialAt   time.Time // when the last trial slot was claimed
	fiveXX    int
	fiveLimit int
}

// NewBreaker returns a closed breaker.
func NewBreaker(failures int, openFor time.Duration, trials, fiveXXStreak int) *Breaker {
	b := &Breaker{failures: failures, openFor: openFor, trials: trials, fiveLimit: fiveXXStreak, now: time.Now}
	b.closed.Store(true)
	b.clean.Store(true)
	return b
}

// State reports the state, turning open into half-open once the period has passed.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tickLocked()
	return b.state
}

func (b *Breaker) tickLocked() {
	if b.state == BreakerOpen && b.now().Sub(b.openedAt) >= b.openFor {
		b.state = BreakerHalfOpen
		b.inTrial = 0
	}
	// A trial whose outcome was never booked (an answer no path judges, a panic) must
	// not hold its slot forever: trials claimed an open period ago count as lost.
	if b.state == BreakerHalfOpen && b.inTrial >= b.trials && b.now().Sub(b.trialAt) >= b.openFor {
		b.inTrial = 0
	}
}

// Ready says whether a request could be admitted now (selection filter; no side effect
// beyond the open -> half-open transition).
func (b *Breaker) Ready() bool { return b.admit(false) }

// Allow admits one request, claiming a trial slot when half-open. Every Allow that
// returns true must be followed by Success, Failure or Neutral.
func (b *Breaker) Allow() bool { return b.admit(true) }

func (b *Breaker) admit(claim bool) bool {
	if b.closed.Load() { // the common case: no lock on the request path
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tickLocked()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		if b.inTrial < b.trials {
			if claim {
				b.inTrial++
				b.trialAt = b.now()
			}
			return true
		}
	}
	return false
}

// Success records a request that reached the engine and got a non-5xx answer.
func (b *Breaker) Success() {
	if b.clean.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.streak, b.fiveXX = 0, 0
	if b.state == BreakerHalfOpen {
		b.state = BreakerClosed
		b.inTrial = 0
		b.closed.Store(true)
	}
	b.clean.Store(b.state == BreakerClosed)
}

// Failure records a connect failure (or timeout).
func (b *Breaker) Failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.clean.Store(false)
	b.streak++
	b.failLocked(b.streak >= b.failures)
}

// FiveXX records a 5xx answer; it opens the breaker only with a configured streak.
func (b *Breaker) FiveXX() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.clean.Store(false)
	b.fiveXX++
	b.failLocked(b.fiveLimit > 0 && b.fiveXX >= b.fiveLimit)
}

func (b *Breaker) failLocked(trip bool) {
	if b.state == BreakerHalfOpen || trip {
		b.state = BreakerOpen
		b.closed.Store(false)
		b.openedAt = b.now()
		b.inTrial = 0
		b.streak, b.fiveXX = 0, 0
	}
}

// Neutral releases a trial slot without judging the endpoint (e.g. the client left).
func (b *Breaker) Neutral() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerHalfOpen && b.inTrial > 0 {
		b.inTrial--
	}
}
