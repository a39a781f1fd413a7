package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp"
)

// The live event stream (a SUB to the engine's PUB) and the replay DEALER (to the
// engine's ROUTER) are both read by internal/zmtp: one goroutine and one buffered reader
// per connection, frames into reused buffers, a handshake bounded by DialTimeout and a
// message by zmtp.DefaultMaxMessage. (The replay once used zmq4's DEALER, whose
// handshake has no deadline and which allocates whatever size a frame announces: a
// stalled replay peer leaked a goroutine and a socket per replay, a hostile one crashed
// the process.)

// rankSub follows one data-parallel rank of a vLLM/SGLang endpoint.
type rankSub struct {
	e          *endpoint
	rank       int
	addr       string
	replayAddr string
	a          *applier

	ctx      context.Context
	last     int64 // last applied seq, -1 = none yet
	dupFrom  int64 // after a replay, live seqs in [dupFrom, dupUntil] are duplicates
	dupUntil int64
	// lastProtoErr is the protocol error last WARNed about (protocolError).
	lastProtoErr string
}

func newRankSub(e *endpoint, r *rankState) *rankSub {
	s := &rankSub{e: e, rank: r.rank, addr: rankAddr(e.cfg.Events, r.rank), a: newApplier(e, r), last: -1, dupUntil: -1}
	if e.cfg.Replay != "" {
		s.replayAddr = rankAddr(e.cfg.Replay, r.rank)
	}
	return s
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// backoff sleeps d unless ctx ends or wake fires first; it reports a wake (Redial).
func backoff(ctx context.Context, d time.Duration, wake <-chan struct{}) (woken bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-wake:
		return true
	}
	return false
}

func (s *rankSub) run(ctx context.Context) {
	cfg := &s.e.m.cfg
	log := cfg.Logger.With("endpoint", s.e.cfg.Name, "rank", s.rank, "addr", s.addr)
	delay := cfg.RetryInterval
	everUp := false
	s.ctx = ctx
	opt := zmtp.Options{Subscribe: []string{s.e.cfg.Topic}, Timeout: cfg.DialTimeout}
	for ctx.Err() == nil {
		z, err := zmtp.Dial(ctx, s.addr, opt)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.e.c.dialFailures.Inc()
			if errors.Is(err, zmtp.ErrProtocol) {
				s.protocolError(log, "ingest: the engine's event socket does not speak ZMTP 3.x PUB: redialing", err)
			} else {
				log.Debug("ingest: dial failed", "err", err, "retry_in", delay)
			}
			if backoff(ctx, delay, s.e.wake) {
				log.Info("ingest: engine is back (health check): redialing now")
				delay = cfg.RetryInterval
				continue
			}
			delay = min(2*delay, cfg.MaxRetryInterval)
			continue
		}
		delay = cfg.RetryInterval
		if everUp {
			s.e.c.reconnects.Inc()
		}
		everUp = true
		s.e.ranksUp.Add(1)
		log.Info("ingest: subscribed")
		stop := context.AfterFunc(ctx, func() { z.Close() }) // unblocks Recv
		if s.replayAddr != "" {
			s.replay(ctx, -1)
		}
		upAt := time.Now()
		err = s.loop(z)
		stop()
		s.e.ranksUp.Add(-1)
		z.Close()
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, zmtp.ErrProtocol):
			// The stream broke the protocol (an oversize or malformed frame, an ERROR):
			// what it held up to here stays; redial after the retry interval (a peer that
			// breaks every connection at once must not spin this loop).
			s.protocolError(log, "ingest: event stream broke the ZMTP protocol: redialing", err)
			backoff(ctx, delay, s.e.wake)
		default:
			s.lastProtoErr = "" // a connection that kept the protocol: WARN again next time
			s.e.protoErr.Store(nil)
			log.Info("ingest: connection lost, redialing", "err", err)
			if time.Since(upAt) < cfg.RetryInterval {
				// A peer that closes each connection right after the handshake must not
				// spin this loop either; one that was up a while is redialed at once.
				backoff(ctx, delay, s.e.wake)
			}
		}
	}
}

// protocolError counts a peer that broke ZMTP and WARNs when the error differs from the
// last one WARNed since a connection last ended cleanly (a misconfigured endpoint
// redialing every few seconds says so once).
func (s *rankSub) protocolError(log *slog.Logger, msg string, err error) {
	s.e.c.protocolErrors.Inc()
	text := err.Error()
	s.e.protoErr.Store(&text)
	if text != s.lastProtoErr {
		s.lastProtoErr = text
		log.Warn(msg, "err", err)
	}
}

// loop applies live messages until the connection ends, and returns why it ended.
func (s *rankSub) loop(z *zmtp.Sub) error {
	for {
		frames, err := z.Recv()
		if err != nil {
			return err
		}
		s.handle(frames) // frames are z's buffers: nothing keeps them past this call
	}
}

// topicMatches reports whether a message's topic frame is the configured topic t. A
// snapshot-capable SGLang publisher appends metadata after a NUL to its topic frame
// (t + "\x00sgl-kv-epoch=<epoch>", and "\x00sgl-kv-snapshot=<id>" on its barriers): that
// is still t.
func topicMatches(frame []byte, t string) bool {
	return len(frame) >= len(t) && string(frame[:len(t)]) == t && (len(frame) == len(t) || frame[len(t)] == 0)
}

var (
	errLiveFrames   = errors.New("ingest: a live message is not [topic, seq (8 octets), payload]")
	errReplayFrames = errors.New("ingest: a replayed message is not [\"\", (topic,) seq (8 octets), payload]")
)

// handle applies one live message [topic, seq, payload].
func (s *rankSub) handle(frames [][]byte) {
	c := &s.e.c
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.e.lostMessage(errLiveFrames)
		return
	}
	if t := s.e.cfg.Topic; t != "" && !topicMatches(frames[0], t) {
		c.topicSkipped.Inc()
		return
	}
	seq := int64(binary.BigEndian.Uint64(frames[1]) & (1<<63 - 1))
	if s.replayAddr != "" && s.last >= 0 && seq > s.last+1 && !(seq >= s.dupFrom && seq <= s.dupUntil) {
		// Lost batches (a PUB drops at its high-water mark): fetch them from the
		// engine's replay buffer before the window has to keep or clear anything.
		s.replay(s.ctx, seq)
		if s.last == seq-1 {
			c.gapsFilled.Inc()
		}
	}
	if s.accept(seq, false) {
		if s.a.apply(frames[2]) == nil {
			s.e.m.observeLag(s.a.dec.Timestamp())
		}
		s.e.noteSeq(seq)
	}
}

// accept runs the seq window: a gap up to SeqWindow keeps the inventory, a larger one or
// a seq going backwards (an engine restart) clears it. It reports whether to apply.
func (s *rankSub) accept(seq int64, replayed bool) bool {
	e := s.e
	c := &e.c
	win := int64(e.m.cfg.SeqWindow)
	switch {
	case s.last < 0 || seq == s.last+1:
	case seq <= s.last:
		if !replayed && seq >= s.dupFrom && seq <= s.dupUntil {
			c.duplicates.Inc()
			return false
		}
		c.restarts.Inc()
		e.m.cfg.Logger.Info("ingest: seq went backwards (engine restart): clearing this rank",
			"endpoint", e.cfg.Name, "rank", s.rank, "last", s.last, "seq", seq)
		e.clear(s.a.r)
	case seq-s.last-1 <= win:
		c.gapsKept.Inc()
	default:
		c.gapsCleared.Inc()
		e.m.cfg.Logger.Info("ingest: seq gap beyond window: clearing this rank",
			"endpoint", e.cfg.Name, "rank", s.rank, "last", s.last, "seq", seq)
		e.clear(s.a.r)
	}
	s.last = seq
	if seq > s.dupUntil {
		s.dupUntil = -1
	}
	return true
}

// replay asks the engine's ROUTER for every buffered batch from the next seq on and
// applies them, up to the end marker or ReplayTimeout. upTo >= 0 fills a gap: batches
// from upTo on are left to the live stream.
func (s *rankSub) replay(ctx context.Context, upTo int64) {
	cfg := &s.e.m.cfg
	rctx, cancel := context.WithTimeout(ctx, cfg.ReplayTimeout)
	defer cancel()
	z, err := zmtp.DialDealer(rctx, s.replayAddr, zmtp.Options{Timeout: cfg.DialTimeout})
	if err != nil {
		cfg.Logger.Info("ingest: replay unavailable", "endpoint", s.e.cfg.Name, "rank", s.rank, "err", err)
		return
	}
	defer z.Close()
	stop := context.AfterFunc(rctx, func() { z.Close() }) // unblocks Recv at the timeout
	defer stop()
	start := s.last + 1
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], uint64(start))
	if err := z.Send(nil, sb[:]); err != nil {
		return
	}
	n := 0
	for {
		f, err := z.Recv()
		if err != nil {
			cfg.Logger.Info("ingest: replay ended without end marker", "endpoint", s.e.cfg.Name, "err", err, "batches", n)
			break
		}
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the DEALER/ROUTER delimiter
		}
		var seqb, payload []byte
		switch len(f) {
		case 2: // ["", seq, payload]
			seqb, payload = f[0], f[1]
		case 3: // ["", topic, seq, payload]
			seqb, payload = f[1], f[2]
		default:
			s.e.lostMessage(errReplayFrames)
			continue
		}
		if len(seqb) != 8 {
			s.e.lostMessage(errReplayFrames)
			continue
		}
		seq := binary.BigEndian.Uint64(seqb)
		if seq == ^uint64(0) {
			break
		}
		if upTo >= 0 && int64(seq&(1<<63-1)) >= upTo {
			continue // the live stream has it
		}
		s.e.c.replayed.Inc()
		n++
		if s.accept(int64(seq&(1<<63-1)), true) {
			s.a.apply(payload)
			s.e.noteSeq(int64(seq & (1<<63 - 1)))
		}
	}
	if upTo < 0 {
		s.dupFrom, s.dupUntil = start, s.last
	}
}
