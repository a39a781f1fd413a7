package enginesim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Each engine's prefill/decode (P/D) protocol, as the engine defines it and kvgate's
// proxy (proxy/pd.go) drives it; docs/CONTRACTS.md, "P/D protocols", cites the sources.
//
//   - vLLM: the prefill request carries kv_transfer_params{do_remote_decode:true} and
//     answers kv_transfer_params naming the blocks; the decode request carries those back
//     (do_remote_prefill:true).
//   - SGLang: one request with bootstrap_host/bootstrap_port/bootstrap_room goes to the
//     prefill and the decode server at once; the decode server pulls the KV from the
//     prefill server's bootstrap port. The simulator's bootstrap server answers, for a
//     room, when its prefill is done (a long poll), so decode waits for the real prefill.
//   - TensorRT-LLM: the context request carries disaggregated_params{request_type:
//     "context_only"} and answers the choice's disaggregated_params (ctx_request_id,
//     encoded_opaque_state, first_gen_tokens) and prompt_token_ids; the generation
//     request carries them back with request_type "generation_only".
//
// A request in another engine's protocol, or in the wrong role's, is refused with a 400
// that says which.

// pdStep is a request's part in a P/D pair.
type pdStep uint8

const (
	pdNone    pdStep = iota
	pdPrefill        // compute the prompt's KV and stop after the first token
	pdDecode         // the KV comes from a prefill engine: only decode here
)

type kvTransfer struct {
	DoRemoteDecode  bool `json:"do_remote_decode"`
	DoRemotePrefill bool `json:"do_remote_prefill"`
}

// trtDisaggParams is TensorRT-LLM's DisaggregatedParams (the fields the simulator reads).
type trtDisaggParams struct {
	RequestType        string  `json:"request_type"`
	FirstGenTokens     []int64 `json:"first_gen_tokens"`
	CtxRequestID       *uint64 `json:"ctx_request_id"`
	EncodedOpaqueState *string `json:"encoded_opaque_state"`
}

// pdFields are the P/D fields of a generate request, whichever engine they belong to.
type pdFields struct {
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
	DisaggregatedParams json.RawMessage `json:"disaggregated_params"`
	BootstrapHost       json.RawMessage `json:"bootstrap_host"`
	BootstrapPort       json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom       json.RawMessage `json:"bootstrap_room"`
}

func (f *pdFields) hasBootstrap() bool {
	return !isNull(f.BootstrapHost) || !isNull(f.BootstrapPort) || !isNull(f.BootstrapRoom)
}

// pdPlan is what parsePD found in a request.
type pdPlan struct {
	step      pdStep
	bootstrap string // SGLang: the prefill server's bootstrap host:port
	room      uint64 // SGLang bootstrap_room
}

func wrongProtocol(engine, got string) error {
	want := map[string]string{EngineVLLM: "vLLM's kv_transfer_params", EngineSGLang: "SGLang's bootstrap_host/bootstrap_port/bootstrap_room",
		EngineTRTLLM: "TensorRT-LLM's disaggregated_params"}[engine]
	return badRequest("this engine (%s) speaks %s for prefill/decode disaggregation; the request carries %s", engine, want, got)
}

// parsePD reads the request's P/D fields for this engine and role.
func (s *Sim) parsePD(p *prepared) error {
	f := &p.req.pdFields
	hasKTP, hasDP := !isNull(f.KVTransferParams), !isNull(f.DisaggregatedParams)
	switch s.cfg.Engine {
	case EngineVLLM:
		switch {
		case hasDP:
			return wrongProtocol(s.cfg.Engine, "TensorRT-LLM's disaggregated_params")
		case f.hasBootstrap():
			return wrongProtocol(s.cfg.Engine, "SGLang's bootstrap fields")
		case hasKTP:
			return s.parseVLLM(p)
		}
	case EngineSGLang:
		switch {
		case hasKTP:
			return wrongProtocol(s.cfg.Engine, "vLLM's kv_transfer_params")
		case hasDP:
			return wrongProtocol(s.cfg.Engine, "TensorRT-LLM's disaggregated_params")
		}
		return s.parseSGLang(p)
	case EngineTRTLLM:
		switch {
		case hasKTP:
			return wrongProtocol(s.cfg.Engine, "vLLM's kv_transfer_params")
		case f.hasBootstrap():
			return wrongProtocol(s.cfg.Engine, "SGLang's bootstrap fields")
		case hasDP:
			return s.parseTRT(p)
		}
	}
	return nil
}

func (s *Sim) parseVLLM(p *prepared) error {
	var kv kvTransfer
	if err := json.Unmarshal(p.req.KVTransferParams, &kv); err != nil {
		return badRequest("invalid kv_transfer_params: %v", err)
	}
	switch {
	case kv.DoRemoteDecode && kv.DoRemotePrefill:
		return badRequest("kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true")
	case kv.DoRemoteDecode:
		if s.cfg.Role == RoleDecode {
			return badRequest("do_remote_decode sent to a decode-only engine")
		}
		p.pd.step = pdPrefill
	case kv.DoRemotePrefill:
		if s.cfg.Role == RolePrefill {
			return badRequest("do_remote_prefill sent to a prefill-only engine")
		}
		p.pd.step = pdDecode
	}
	return nil
}

// parseSGLang: a prefill or decode server in disaggregation mode needs the bootstrap
// triple; a server not in that mode ignores it, as SGLang does.
func (s *Sim) parseSGLang(p *prepared) error {
	f := &p.req.pdFields
	if s.cfg.Role == RoleBoth {
		return nil
	}
	if !f.hasBootstrap() {
		return badRequest("this SGLang engine runs in disaggregation mode (%s): the request needs bootstrap_host, bootstrap_port and bootstrap_room", s.cfg.Role)
	}
	var host string
	var port int
	if err := json.Unmarshal(f.BootstrapHost, &host); err != nil || host == "" {
		return badRequest("bootstrap_host must be a non-empty string")
	}
	if err := json.Unmarshal(f.BootstrapPort, &port); err != nil || port < 1 || port > 65535 {
		return badRequest("bootstrap_port must be a port number")
	}
	room, err := strconv.ParseUint(string(bytes.TrimSpace(f.BootstrapRoom)), 10, 64)
	if err != nil {
		return badRequest("bootstrap_room must be a non-negative integer")
	}
	p.pd = pdPlan{step: pdPrefill, bootstrap: net.JoinHostPort(host, strconv.Itoa(port)), room: room}
	if s.cfg.Role == RoleDecode {
		p.pd.step = pdDecode
	}
	return nil
}

func (s *Sim) parseTRT(p *prepared) error {
	var dp trtDisaggParams
	if err := json.Unmarshal(p.req.DisaggregatedParams, &dp); err != nil {
		return badRequest("invalid disaggregated_params: %v", err)
	}
	switch dp.RequestType {
	case "context_and_generation":
	case "context_only":
		if s.cfg.Role == RoleDecode {
			return badRequest("disaggregated_params.request_type context_only sent to a generation-only engine")
		}
		if p.req.Stream {
			return badRequest("a context_only request cannot stream")
		}
		p.pd.step = pdPrefill
	case "generation_only":
		if s.cfg.Role == RolePrefill {
			return badRequest("disaggregated_params.request_type generation_only sent to a context-only engine")
		}
		if dp.CtxRequestID == nil || dp.EncodedOpaqueState == nil {
			return badRequest("a generation_only request needs the context server's ctx_request_id and encoded_opaque_state")
		}
		if err := checkOpaqueState(*dp.EncodedOpaqueState, *dp.CtxRequestID, p); err != nil {
			return err
		}
		p.pd.step = pdDecode
	default:
		return badRequest("disaggregated_params.request_type %q: want context_only, generation_only or context_and_generation", dp.RequestType)
	}
	return nil
}

// The simulator's opaque state names the context request and the prompt it computed, so
// a generation request for another prompt is refused instead of decoding from wrong KV.
func opaqueState(engine string, ctxID uint64, p *prepared) string {
	return base64.StdEncoding.EncodeToString([]byte("kvgate-enginesim:" + engine + ":" + strconv.FormatUint(ctxID, 10) + ":" +
		strconv.Itoa(len(p.tokens)) + ":" + strconv.FormatUint(p.seed, 16)))
}

func checkOpaqueState(state string, ctxID uint64, p *prepared) error {
	raw, err := base64.StdEncoding.DecodeString(state)
	parts := strings.Split(string(raw), ":")
	if err != nil || len(parts) != 5 || parts[0] != "kvgate-enginesim" || parts[2] != strconv.FormatUint(ctxID, 10) {
		return badRequest("disaggregated_params.encoded_opaque_state was not made by a simulated context server for ctx_request_id %d", ctxID)
	}
	if parts[3] != strconv.Itoa(len(p.tokens)) || parts[4] != strconv.FormatUint(p.seed, 16) {
		return badRequest("disaggregated_params belong to another prompt (context server %s computed %s tokens, this request has %d)", parts[1], parts[3], len(p.tokens))
	}
	return nil
}

// appendTRTContext appends a context_only answer's choice field disaggregated_params.
func (g *gen) appendTRTContext(b []byte) []byte {
	b = append(b, `,"disaggregated_params":{"request_type":"context_only","first_gen_tokens":[`...)
	b = strconv.AppendUint(b, g.wordIndex(0), 10)
	b = append(b, `],"ctx_request_id":`...)
	b = strconv.AppendUint(b, g.reqID, 10)
	b = append(b, `,"encoded_opaque_state":`...)
	b = strconv.AppendQuote(b, opaqueState(g.s.cfg.Name, g.reqID, g.p))
	return append(b, `,"draft_tokens":null}`...)
}

// bootstrapServer is a simulated SGLang prefill server's bootstrap port. GET
// /sim/kv/{room} waits until that room's prefill is done and answers what it computed;
// the decode side reads it before decoding (kvgate's proxy sends both legs at once).
type bootstrapServer struct {
	ln      net.Listener
	srv     *http.Server
	timeout time.Duration

	mu    sync.Mutex
	rooms map[uint64]*room
}

type room struct {
	done     chan struct{}
	prefill  bool // a prefill request holds the room
	failed   bool
	tokens   int
	seed     uint64
	finished time.Time
}

// roomsKept bounds the rooms nobody collected before finished ones are swept.
const roomsKept = 1024

func startBootstrap(addr string, timeout time.Duration) (*bootstrapServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &bootstrapServer{ln: ln, timeout: timeout, rooms: map[uint64]*room{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sim/kv/{room}", b.serveRoom)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go b.srv.Serve(ln)
	return b, nil
}

func (b *bootstrapServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if b.srv.Shutdown(ctx) != nil {
		b.srv.Close()
	}
}

// roomLocked returns the room, creating it.
func (b *bootstrapServer) roomLocked(id uint64) *room {
	r := b.rooms[id]
	if r == nil {
		if len(b.rooms) >= roomsKept {
			for k, old := range b.rooms {
				if !old.finished.IsZero() && time.Since(old.finished) > b.timeout {
					delete(b.rooms, k)
				}
			}
		}
		r = &room{done: make(chan struct{})}
		b.rooms[id] = r
	}
	return r
}

// open marks the room taken by a prefill request.
func (b *bootstrapServer) open(id uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.roomLocked(id)
	if r.prefill {
		return badRequest("bootstrap_room %d is already in use on this prefill server", id)
	}
	r.prefill = true
	return nil
}

// finish records the room's prefill: done (its prompt's size and hash) or failed.
func (b *bootstrapServer) finish(id uint64, ok bool, tokens int, seed uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.rooms[id]
	if r == nil || !r.finished.IsZero() {
		return
	}
	r.failed, r.tokens, r.seed, r.finished = !ok, tokens, seed, time.Now()
	close(r.done)
}

type roomAnswer struct {
	PromptTokens int    `json:"prompt_tokens"`
	Seed         string `json:"seed"`
}

func (b *bootstrapServer) serveRoom(w http.ResponseWriter, req *http.Request) {
	id, err := strconv.ParseUint(req.PathValue("room"), 10, 64)
	if err != nil {
		writeError(w, badRequest("room must be an integer"))
		return
	}
	b.mu.Lock()
	r := b.roomLocked(id)
	b.mu.Unlock()
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
		b.forget(id, r)
		writeError(w, &httpError{code: http.StatusGatewayTimeout, msg: fmt.Sprintf("bootstrap room %d: no prefill finished within %v", id, b.timeout)})
		return
	case <-req.Context().Done():
		b.forget(id, r)
		return
	}
	b.mu.Lock()
	delete(b.rooms, id) // one decode collects a room's KV
	b.mu.Unlock()
	if r.failed {
		writeError(w, &httpError{code: http.StatusConflict, msg: fmt.Sprintf("bootstrap room %d: the prefill request failed", id)})
		return
	}
	out, _ := json.Marshal(roomAnswer{PromptTokens: r.tokens, Seed: strconv.FormatUint(r.seed, 16)})
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

// inflight counts the rooms whose KV is computed but not yet collected by a decode.
func (b *bootstrapServer) inflight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, r := range b.rooms {
		if !r.finished.IsZero() && !r.failed {
			n++
		}
	}
	return n
}

// forget drops a room a decode gave up on, unless a prefill holds it.
func (b *bootstrapServer) forget(id uint64, r *room) {
	b.mu.Lock()
	if b.rooms[id] == r && !r.prefill {
		delete(b.rooms, id)
	}
	b.mu.Unlock()
}

var bootstrapClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// fetchKV is the decode side: wait for the prefill server's room and check it holds this
// prompt's KV.
func (s *Sim) fetchKV(ctx context.Context, p *prepared) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.BootstrapTimeout)
	defer cancel()
	url := "http://" + p.pd.bootstrap + "/sim/kv/" + strconv.FormatUint(p.pd.room, 10)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := bootstrapClient.Do(req)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return &httpError{code: http.StatusGatewayTimeout, msg: fmt.Sprintf("bootstrap %s (room %d): no prefill finished within %v", p.pd.bootstrap, p.pd.room, s.cfg.BootstrapTimeout)}
		}
		return &httpError{code: http.StatusBadGateway, msg: fmt.Sprintf("bootstrap %s (room %d): %v", p.pd.bootstrap, p.pd.room, err)}
	}
	defer resp.Body.Close()
	var a roomAnswer
	body := json.NewDecoder(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var e struct{ Message string }
		body.Decode(&e)
		return &httpError{code: http.StatusBadGateway, msg: fmt.Sprintf("bootstrap %s: HTTP %d: %s", p.pd.bootstrap, resp.StatusCode, e.Message)}
	}
	if err := body.Decode(&a); err != nil {
		return &httpError{code: http.StatusBadGateway, msg: fmt.Sprintf("bootstrap %s (room %d): %v", p.pd.bootstrap, p.pd.room, err)}
	}
	if a.PromptTokens != len(p.tokens) || a.Seed != strconv.FormatUint(p.seed, 16) {
		return badRequest("bootstrap room %d holds KV for another prompt (%d tokens; this request has %d)", p.pd.room, a.PromptTokens, len(p.tokens))
	}
	return nil
}
