package proxy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/ingest"
	"github.com/kvgate/kvgate/shard"
)

// The fleet changes without a restart: the endpoints file is watched, the admin API adds
// and removes endpoints, discover=dns endpoints follow their name's A/AAAA records. Every
// change goes through one path (fleetCtl.change): build the whole new endpoint list,
// validate it like a rule at start, then diff it by name against the running one. An
// unchanged endpoint is not touched (its inventory keys, hit counts, breaker and learned
// rates stay); a removed one is retired (no new request picks it), drains its in-flight
// requests, then loses its subscriber and inventory and frees its slot; an added one
// takes a free slot and starts its subscriber, health checks, load scrape and breaker.
// A changed line is a removal plus an addition of that endpoint only. A change that does
// not validate is refused whole, with a WARN, and the running fleet stays.
//
// Slots: an endpoint's index is its slot in every per-endpoint array (inventory masks,
// queues, loads, breakers, metrics). The slot table is sized once at start
// (-max-endpoints; by default the initial count rounded up to the inventory's mask
// width, 8/16/32/64, which costs no inventory memory) and an endpoint keeps its slot for
// life. A slot is reused only once its old endpoint drained and its keys are cleared.

// roster is the endpoint set the request path reads: an immutable snapshot with one
// entry per slot, swapped whole on every fleet change and read with one atomic load.
// A vacant slot holds a placeholder that is always retired.
type roster struct {
	eps                     []*endpoint
	prefillMask, decodeMask shard.Mask
	// slots are the slots of endpoints in the fleet (not draining, not vacant), so the
	// request path's eligibility loop costs the fleet's size, not -max-endpoints.
	slots []int
}

func (s *Server) roster() *roster { return s.ros.Load() }

func (r *roster) clone() *roster {
	return &roster{eps: slices.Clone(r.eps)}
}

// setRoles recomputes the fleet's slots and the mode-1 role masks (callers retire
// endpoints before).
func (r *roster) setRoles() {
	n := len(r.eps)
	r.prefillMask, r.decodeMask = shard.NewMask(n), shard.NewMask(n)
	r.slots = r.slots[:0]
	for i, e := range r.eps {
		if e.retired.Load() { // vacant, or draining: no new request takes it in any role
			continue
		}
		r.slots = append(r.slots, i)
		switch e.spec.Role {
		case RolePrefill:
			r.prefillMask.Set(i)
		case RoleDecode:
			r.decodeMask.Set(i)
		}
	}
}

// slotsFor is the slot table's size: -max-endpoints when set, else n rounded up to the
// inventory's next mask width (8, 16, 32, 64 endpoints share one layout each).
func slotsFor(n, maxEndpoints int) int {
	if maxEndpoints > 0 {
		return max(maxEndpoints, n)
	}
	for _, w := range [...]int{8, 16, 32, 64} {
		if n <= w {
			return w
		}
	}
	return min((n+63)/64*64, shard.MaxEndpoints)
}

func (s *Server) newEndpoint(sp EndpointSpec, i int) *endpoint {
	cfg := &s.cfg
	e := &endpoint{spec: sp, idx: i,
		breaker: NewBreaker(cfg.Breaker.Failures, cfg.Breaker.OpenFor, cfg.Breaker.HalfOpen, cfg.Breaker.Streak5xx)}
	e.down.Store(sp.Down)
	e.healthy.Store(true)
	return e
}

func (s *Server) vacantEndpoint(i int) *endpoint {
	e := s.newEndpoint(EndpointSpec{}, i)
	e.vacant = true
	e.retired.Store(true)
	e.healthy.Store(false)
	return e
}

// fleetCtl owns fleet changes; one runs at a time.
type fleetCtl struct {
	s        *Server
	resolver *net.Resolver
	cap      int

	mu     sync.Mutex
	static []EndpointSpec // -endpoint flags: fixed for the process
	file   []EndpointSpec // -endpoints-file as last accepted
	admin  []EndpointSpec // added through POST /admin/endpoints
	lines  map[string]int // file endpoint name -> its line, for WARNs
	sum    [sha256.Size]byte
	// answers are each discover=dns template's last accepted addresses, by its name.
	answers map[string][]netip.Addr
	free    []int // vacant slots, ready for an endpoint
	// refused are the refused changes that still stand, by source (fleetChange.why): the
	// running fleet differs from that source until a change re-applying it applies
	// (reapplies); another source's success does not hide it.
	refused map[string]refusal
	// shown is the latest of refused (nil: none) for view, which takes no lock: a change
	// holds mu through DNS lookups of up to dnsTimeout, and /metrics must not wait on one.
	shown atomic.Pointer[refusal]
}

// refusal is one standing refused change: its source and why.
type refusal struct {
	why, msg string
	at       time.Time
}

// reapplies are the sources a change by why brings the fleet back in line with: its
// own, and what it re-reads (a file reload and SIGHUP read the file and look names up).
var reapplies = map[string][]string{
	"-endpoints-file": {"-endpoints-file", "dns"},
	"SIGHUP":          {"SIGHUP", "-endpoints-file", "dns"},
	"dns":             {"dns"},
	"admin":           {"admin"},
}

// fleetView is /debug/inventory's "fleet": the slot table and the last refused change.
type fleetView struct {
	Slots       int    `json:"slots"`
	Free        int    `json:"free_slots"`
	Draining    int    `json:"draining"`
	LastRefused string `json:"last_refused,omitempty"`
	RefusedAt   string `json:"refused_at,omitempty"`
}

// view reads the roster and the published refusal only (no lock: see shown). A free
// slot is a vacant one laid out for one rank (drain keeps a data-parallel one's).
func (f *fleetCtl) view() fleetView {
	v := fleetView{Slots: f.cap}
	if r := f.shown.Load(); r != nil {
		v.LastRefused, v.RefusedAt = r.why+": "+r.msg, r.at.UTC().Format(time.RFC3339)
	}
	for i, e := range f.s.roster().eps {
		switch {
		case e.vacant && f.s.ranks.dp[i] <= 1:
			v.Free++
		case !e.vacant && e.retired.Load():
			v.Draining++
		}
	}
	return v
}

// count books one change attempt by its source and result; one that changed nothing
// (a DNS answer as before) clears the refusals it re-applies but is not counted.
func (f *fleetCtl) count(why string, changed bool, err error) {
	result := "applied"
	if err != nil {
		result = "refused"
		f.refuse(why, err.Error())
	} else {
		for _, src := range reapplies[why] {
			delete(f.refused, src)
		}
		f.publish()
	}
	if err != nil || changed {
		f.s.m.set.GetOrCreateCounter(`kvgate_fleet_changes_total{by="` + why + `",result="` + result + `"}`).Inc()
	}
}

// refuse records why's refusal (f.mu held).
func (f *fleetCtl) refuse(why, msg string) {
	f.refused[why] = refusal{why: why, msg: msg, at: time.Now()}
	f.publish()
}

// publish shows the latest standing refusal (f.mu held).
func (f *fleetCtl) publish() {
	var last *refusal
	for _, r := range f.refused {
		if last == nil || r.at.After(last.at) {
			last = &r
		}
	}
	f.shown.Store(last)
}

func newFleetCtl(s *Server, r *net.Resolver) *fleetCtl {
	if r == nil {
		r = net.DefaultResolver
	}
	return &fleetCtl{s: s, resolver: r, answers: map[string][]netip.Addr{}, refused: map[string]refusal{}}
}

// initial splits the rule's endpoints into flags and file ones and resolves the
// discover=dns templates: the fleet the server starts with.
func (f *fleetCtl) initial() ([]EndpointSpec, error) {
	cfg := &f.s.cfg
	eps := cfg.Fleet.Endpoints
	if cfg.Fleet.EndpointsFile != "" {
		n := min(max(cfg.Fleet.StaticEndpoints, 0), len(eps))
		f.static, f.file = slices.Clone(eps[:n]), slices.Clone(eps[n:])
		if b, err := os.ReadFile(cfg.Fleet.EndpointsFile); err == nil {
			f.sum = sha256.Sum256(b)
			if _, lines, err := parseEndpointsFile(cfg.Fleet.EndpointsFile, b); err == nil {
				f.lines = lines
			}
		}
	} else {
		f.static = slices.Clone(eps)
	}
	answers := map[string][]netip.Addr{}
	out, err := f.expand(f.all(f.static, f.file, nil), answers, true)
	if err != nil {
		flag := "-endpoint"
		if cfg.Fleet.EndpointsFile != "" {
			flag = "-endpoint/-endpoints-file"
		}
		return nil, refuse(flag, "%v", err)
	}
	f.answers = answers
	if cfg.Fleet.MaxEndpoints > 0 && len(out) > cfg.Fleet.MaxEndpoints {
		return nil, refuse("-max-endpoints", "%d: the rule starts with %d endpoints", cfg.Fleet.MaxEndpoints, len(out))
	}
	c := *cfg
	c.Fleet.Endpoints = out
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

func (f *fleetCtl) all(static, file, admin []EndpointSpec) []EndpointSpec {
	out := make([]EndpointSpec, 0, len(static)+len(file)+len(admin))
	out = append(out, static...)
	out = append(out, file...)
	return append(out, admin...)
}

// expand replaces each discover=dns template by one endpoint per address of its name.
// resolve false reuses the last answer (held in answers, which expand fills).
func (f *fleetCtl) expand(eps []EndpointSpec, answers map[string][]netip.Addr, resolve bool) ([]EndpointSpec, error) {
	out := make([]EndpointSpec, 0, len(eps))
	for _, t := range eps {
		if !t.Discover {
			out = append(out, t)
			continue
		}
		addrs, ok := f.answers[t.Name]
		if resolve || !ok {
			var err error
			if addrs, err = f.lookup(t.hostname()); err != nil {
				return nil, fmt.Errorf("endpoint %q: discover=dns: %v", t.Name, err)
			}
		}
		answers[t.Name] = addrs
		for _, a := range addrs {
			out = append(out, t.at(a))
		}
	}
	return out, nil
}

// dnsTimeout bounds one discover=dns lookup.
const dnsTimeout = 5 * time.Second

func (f *fleetCtl) lookup(host string) ([]netip.Addr, error) {
	parent := f.s.ctx // shutdown does not wait for a lookup; nil before Start (the initial ones)
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, dnsTimeout)
	defer cancel()
	addrs, err := f.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	addrs = slices.Compact(addrs)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s has no A/AAAA records", host)
	}
	return addrs, nil
}

// fleetChange is one proposed change: the sources it replaces (nil: unchanged) and
// whether discover=dns names are looked up again.
type fleetChange struct {
	why       string // for the logs: "-endpoints-file", "admin", "dns", "SIGHUP"
	static    []EndpointSpec
	setStatic bool
	file      []EndpointSpec
	setFile   bool
	lines     map[string]int
	sum       [sha256.Size]byte
	admin     []EndpointSpec
	setAdm    bool
	resolve   bool
	// edit, when set, fills the change in from the sources as they are under the fleet's
	// lock (an admin add or remove), so two admin calls at once each keep the other's
	// result. Its error names nothing to change: answered, not booked as a refusal.
	edit func(f *fleetCtl, ch *fleetChange) error
}

// change validates the fleet ch describes and, if it holds, moves the running one to it.
// On refusal nothing changed and the error says why.
func (f *fleetCtl) change(ch fleetChange) (err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch.edit != nil {
		if err := ch.edit(f, &ch); err != nil {
			return err
		}
	}
	changed := false
	defer func() { f.count(ch.why, changed, err) }()
	static, file, admin := f.static, f.file, f.admin
	if ch.setStatic {
		static = ch.static
	}
	if ch.setFile {
		file = ch.file
	}
	if ch.setAdm {
		admin = ch.admin
	}
	answers := map[string][]netip.Addr{}
	want, err := f.expand(f.all(static, file, admin), answers, ch.resolve)
	if err != nil {
		return err
	}
	if err := f.validate(want); err != nil {
		return err
	}
	s := f.s
	cur := s.roster()
	live := map[string]*endpoint{}
	for _, e := range cur.eps {
		if !e.retired.Load() {
			live[e.spec.Name] = e
		}
	}
	var add []EndpointSpec
	keep := map[string]bool{}
	for _, w := range want {
		if e := live[w.Name]; e != nil && e.spec == w {
			keep[w.Name] = true
			continue
		}
		add = append(add, w)
	}
	var remove []*endpoint
	for _, e := range cur.eps {
		if !e.retired.Load() && !keep[e.spec.Name] {
			remove = append(remove, e)
		}
	}
	for _, w := range add {
		// A rank's inventory slot is laid out at start (ranks.go): vacant slots have one.
		if w.DP > 1 {
			return fmt.Errorf("endpoint %q: dp=%d: data-parallel ranks get their inventory slots at start; adding one takes a restart", w.Name, w.DP)
		}
	}
	if len(add) > len(f.free) {
		return fmt.Errorf("%d endpoints to add but %d free slots (-max-endpoints %d; a removed endpoint frees its slot once drained)", len(add), len(f.free), f.cap)
	}
	// Commit: nothing below refuses.
	if ch.setStatic {
		f.static = ch.static
	}
	if ch.setFile {
		f.file, f.lines, f.sum = ch.file, ch.lines, ch.sum
	}
	if ch.setAdm {
		f.admin = ch.admin
	}
	f.answers = answers
	if len(add) == 0 && len(remove) == 0 {
		return nil
	}
	changed = true
	next := cur.clone()
	waits := make([]func(), len(remove))
	for j, e := range remove {
		e.retired.Store(true) // before the roster: see forward's check after loads.Inc
		if fe := f.events(); fe != nil {
			waits[j] = fe.RemoveEndpoint(e.idx)
		}
	}
	var added []*endpoint
	for _, sp := range add {
		i := f.free[0]
		f.free = f.free[1:]
		s.queues.Reset(i)
		if s.kv != nil && s.kv.slotQueues != s.queues {
			s.kv.slotQueues.Reset(i) // rank 0's own queue (ranks.go)
		}
		s.m.relabel(i, sp.Name)
		s.gapWarned[i].Store(0)
		e := s.newEndpoint(sp, i)
		e.healthy.Store(s.cfg.Health.Interval == 0) // eligible once its first check passes
		if s.states != nil {
			s.states.reset(i, e)
		}
		if fe := f.events(); fe != nil {
			ec, err := s.kv.ingestEndpoint(&s.cfg, sp, i)
			if err == nil {
				err = fe.AddEndpoint(ec)
			}
			if err != nil {
				s.log.Error("fleet: endpoint added without its events", "endpoint", sp.Name, "err", err)
			}
		}
		next.eps[i] = e
		added = append(added, e)
	}
	next.setRoles()
	s.ros.Store(next)
	f.rebuildRing(next)
	names := func(es []*endpoint) string {
		var b []string
		for _, e := range es {
			b = append(b, e.spec.Name)
		}
		return strings.Join(b, ",")
	}
	s.log.Info("fleet changed", "by", ch.why, "added", names(added), "removed", names(remove), "endpoints", len(want))
	for _, e := range added {
		if s.cfg.Health.Interval > 0 {
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.checkOne(e) }()
		}
	}
	for j, e := range remove {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); f.drain(e, waits[j]) }()
	}
	return nil
}

// validate checks a proposed fleet as the rule's start would, plus what a running rule
// cannot take on: another engine's hash contract, or event sources that are not this
// replica's own subscribers.
func (f *fleetCtl) validate(want []EndpointSpec) error {
	s := f.s
	c := s.cfg
	c.Fleet.Endpoints = want
	if err := c.Validate(); err != nil {
		var fe *FlagError
		if errors.As(err, &fe) {
			return errors.New(fe.Msg)
		}
		return err
	}
	if s.kv == nil {
		return nil
	}
	if _, ok := s.kv.mgr.(directSource); !ok {
		return errors.New("endpoints change at runtime only with -events-plane direct")
	}
	return nil
}

// fleetEvents is an event source that follows endpoints added and removed at runtime.
type fleetEvents interface {
	AddEndpoint(ingest.EndpointConfig) error
	RemoveEndpoint(i int) (wait func())
}

func (f *fleetCtl) events() fleetEvents {
	if f.s.kv == nil {
		return nil
	}
	fe, _ := f.s.kv.mgr.(fleetEvents)
	return fe
}

func (f *fleetCtl) rebuildRing(r *roster) {
	names := make([]string, len(r.eps))
	weights := make([]int, len(r.eps))
	for i, e := range r.eps {
		if !e.retired.Load() {
			names[i], weights[i] = e.spec.Name, e.spec.Weight
		}
	}
	f.s.ring.Rebuild(names, weights)
}

// drainPoll is how often a retired endpoint's in-flight count is read.
const drainPoll = 20 * time.Millisecond

// slotGrace is the least time between an endpoint's retirement and its slot's reuse: a
// decision that read the fleet before the retirement may still book counters of that
// slot (routing a 1 MiB prompt takes ~100 ms) before forward sees it retired.
const slotGrace = time.Second

// drain waits for a retired endpoint's in-flight requests to complete, then frees its
// subscriber, its inventory keys and its slot. A request that picked it just before it
// retired sees the retirement after counting itself in flight and goes elsewhere
// (forward.go), so once the count reads 0 no request can reach it any more.
func (f *fleetCtl) drain(e *endpoint, waitEvents func()) {
	s := f.s
	t0 := time.Now()
	for s.loads.Get(e.idx) > 0 || time.Since(t0) < slotGrace {
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(drainPoll):
		}
	}
	if waitEvents != nil {
		waitEvents()
	}
	if s.kv != nil {
		for _, sl := range s.ranks.allSlots(e.idx) {
			s.kv.inv.ClearEndpoint(sl)
		}
		if s.kv.trie != nil {
			for _, sl := range append([]int{e.idx}, s.ranks.rankSlots(e.idx)...) {
				s.kv.trie.clearEndpoint(sl)
			}
		}
	}
	for _, sl := range append([]int{e.idx}, s.ranks.allSlots(e.idx)...) {
		s.aff.forget(sl)
	}
	f.mu.Lock()
	next := s.roster().clone()
	next.eps[e.idx] = s.vacantEndpoint(e.idx)
	next.setRoles()
	s.ros.Store(next)
	named := false
	for _, o := range next.eps {
		named = named || (!o.vacant && o.spec.Name == e.spec.Name)
	}
	if !named {
		s.m.unregister(e.idx, e.spec.Name)
	}
	if s.ranks.dp[e.idx] <= 1 {
		f.free = append(f.free, e.idx)
	} // else its rank slots stay laid out for it: the slot is not reused (an added endpoint has one rank)
	f.mu.Unlock()
	s.log.Info("fleet: removed endpoint drained, its inventory and slot freed", "endpoint", e.spec.Name,
		"slot", e.idx, "drained_in", time.Since(t0).Round(time.Millisecond))
}

func sha256Sum(b []byte) [sha256.Size]byte { return sha256.Sum256(b) }

// parseEndpointsFile parses an endpoints file's bytes: the endpoints and each one's line.
// A bad line or a name given twice is an error naming the file and line.
func parseEndpointsFile(path string, b []byte) ([]EndpointSpec, map[string]int, error) {
	var out []EndpointSpec
	lines := map[string]int{}
	for i, t := range strings.Split(string(b), "\n") {
		line := i + 1
		if j := strings.Index(t, " #"); j >= 0 {
			t = t[:j]
		}
		if j := strings.Index(t, "\t#"); j >= 0 {
			t = t[:j]
		}
		t = strings.TrimSpace(t)
		if t == "" || t[0] == '#' {
			continue
		}
		e, err := ParseEndpoint(t)
		if err != nil {
			return nil, nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if first, dup := lines[e.Name]; dup {
			return nil, nil, fmt.Errorf("%s:%d: name %q is used twice (first on line %d)", path, line, e.Name, first)
		}
		lines[e.Name] = line
		out = append(out, e)
	}
	return out, lines, nil
}

// reloadEndpointsFile reads -endpoints-file and applies it when its content changed. A
// file that does not parse or validate is refused whole, with a WARN naming the file and
// line; the running fleet stays.
func (s *Server) reloadEndpointsFile() error {
	f := s.fleet
	path := s.cfg.Fleet.EndpointsFile
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		s.fileUnreadable(err)
		return err
	}
	sum := sha256.Sum256(b)
	f.mu.Lock()
	same := sum == f.sum
	f.mu.Unlock()
	if same {
		return nil
	}
	eps, lines, err := parseEndpointsFile(path, b)
	parsed := err == nil
	if parsed {
		err = f.change(fleetChange{why: "-endpoints-file", file: eps, setFile: true, lines: lines, sum: sum, resolve: true})
		if err != nil {
			err = fmt.Errorf("%s: %w", fileLineOf(path, lines, err), err)
		}
	}
	if err != nil {
		f.mu.Lock()
		f.sum = sum // warn once per content, not every poll
		if parsed {
			f.refuse("-endpoints-file", err.Error()) // change counted it; say where
		} else {
			f.count("-endpoints-file", false, err)
		}
		f.mu.Unlock()
		s.log.Warn("-endpoints-file reload refused: keeping the running endpoints", "file", path, "err", err)
	}
	return err
}

// fileUnreadable shows an -endpoints-file that cannot be read as a refused change,
// WARNed once per episode, not every poll. Its content is forgotten, so the file back
// applies (and clears this) even unchanged.
func (s *Server) fileUnreadable(err error) {
	f := s.fleet
	f.mu.Lock()
	f.sum = [sha256.Size]byte{}
	again := f.refused["-endpoints-file"].msg == err.Error()
	if !again {
		f.count("-endpoints-file", false, err)
	}
	f.mu.Unlock()
	if !again {
		s.log.Warn("-endpoints-file unreadable: keeping the running endpoints", "file", s.cfg.Fleet.EndpointsFile, "err", err)
	}
}

// fileLineOf names where a validation error points in the file: the line of the first
// endpoint the error quotes, else the file.
func fileLineOf(path string, lines map[string]int, err error) string {
	if strings.HasPrefix(err.Error(), path+":") {
		return path
	}
	msg := err.Error()
	best, at := 0, len(msg)
	for name, line := range lines {
		if i := strings.Index(msg, `"`+name+`"`); i >= 0 && i < at {
			best, at = line, i
		}
	}
	if best == 0 {
		return path
	}
	return fmt.Sprintf("%s:%d", path, best)
}

// dnsTicker is one DNS round for Server.every: discover=dns names looked up again. A
// failed lookup keeps the last answer (a DNS blip must not empty the fleet), with a WARN
// once per episode.
func (s *Server) dnsTicker() func() {
	failing := false
	return func() {
		if !s.fleet.hasDiscovery() {
			return
		}
		err := s.fleet.change(fleetChange{why: "dns", resolve: true})
		switch {
		case err != nil && !failing:
			s.log.Warn("discover=dns: lookup or its fleet refused: keeping the last answer", "err", err)
		case err == nil && failing:
			s.log.Info("discover=dns: lookups answer again")
		}
		failing = err != nil
	}
}

// hasDiscovery says some endpoint is a discover=dns template.
func (f *fleetCtl) hasDiscovery() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.all(f.static, f.file, f.admin) {
		if e.Discover {
			return true
		}
	}
	return false
}

// Endpoints are the fleet's endpoints, discover=dns templates expanded, indexed by slot
// (IngestStatus(i), Contract(i)); a vacant or draining slot is a zero spec.
func (s *Server) Endpoints() []EndpointSpec {
	ros := s.roster()
	out := make([]EndpointSpec, 0, len(ros.eps))
	for _, e := range ros.eps {
		sp := EndpointSpec{}
		if !e.retired.Load() {
			sp = e.spec
		}
		out = append(out, sp)
	}
	for len(out) > 0 && out[len(out)-1].Name == "" {
		out = out[:len(out)-1]
	}
	return out
}

// AddEndpoint adds one endpoint (the -endpoint syntax; discover=dns allowed) through the
// same path as a reload.
func (s *Server) AddEndpoint(spec string) error {
	sp, err := ParseEndpoint(spec)
	if err != nil {
		return err
	}
	return s.fleet.change(fleetChange{why: "admin", edit: func(f *fleetCtl, ch *fleetChange) error {
		ch.admin, ch.setAdm = append(slices.Clone(f.admin), sp), true
		return nil
	}})
}

// errNoEndpoint: a remove named no endpoint of the fleet.
var errNoEndpoint = errors.New("no such endpoint")

// RemoveEndpoint removes the endpoint (or discover=dns template) named name. One from
// -endpoint flags or the endpoints file comes back with the file's next change.
func (s *Server) RemoveEndpoint(name string) error {
	del := func(eps []EndpointSpec) ([]EndpointSpec, bool) {
		i := slices.IndexFunc(eps, func(e EndpointSpec) bool { return e.Name == name })
		if i < 0 {
			return eps, false
		}
		return slices.Delete(slices.Clone(eps), i, i+1), true
	}
	return s.fleet.change(fleetChange{why: "admin", edit: func(f *fleetCtl, ch *fleetChange) error {
		var ok bool
		if ch.admin, ok = del(f.admin); ok {
			ch.setAdm = true
		} else if ch.file, ok = del(f.file); ok {
			ch.setFile, ch.lines, ch.sum = true, f.lines, f.sum
		} else if ch.static, ok = del(f.static); ok {
			ch.setStatic = true // flags are fixed otherwise; a removal through the API holds
		}
		if !ok {
			// An address of a discover=dns template is removed with its template only.
			return fmt.Errorf("%w named %q (a discover=dns endpoint is removed by its template's name)", errNoEndpoint, name)
		}
		return nil
	}})
}
