package enginepub

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// TestPublishAndReplay sends batches over real sockets on 127.0.0.1 and replays them.
func TestPublishAndReplay(t *testing.T) {
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv", ReplayBuffer: 2, ReplayTopicFrame: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(p.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := p.Publish(BlockStored{Hashes: []uint64{uint64(i)}, BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		m, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 3 || string(m.Frames[0]) != "kv" || binary.BigEndian.Uint64(m.Frames[1]) != uint64(i) {
			t.Fatalf("msg %d: frames %q", i, m.Frames)
		}
	}
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(p.ReplayAddr()); err != nil {
		t.Fatal(err)
	}
	var s [8]byte
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, s[:])); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for {
		m, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 4 {
			t.Fatalf("reply frames %d", len(m.Frames))
		}
		seq := binary.BigEndian.Uint64(m.Frames[2])
		if seq == ^uint64(0) {
			break
		}
		seqs = append(seqs, seq)
	}
	// The buffer holds 2 batches: seq 0 has been dropped.
	if len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
		t.Fatalf("replayed %v, want [1 2]", seqs)
	}
}

// TestBatchDecodesInPython checks the encoder against Debian's msgpack.
func TestBatchDecodesInPython(t *testing.T) {
	f := Format{Flavor: VLLM, Layout: LayoutMap, DPRank: 2}
	b := f.AppendBatch(nil, 1.5, []Event{
		BlockStored{Hashes: []uint64{1 << 63, 5}, Parent: 7, HasParent: true, TokenIDs: []uint32{1, 2, 70000}, BlockSize: 16, LoRAName: "ad", Medium: "CPU"},
		BlockRemoved{Hashes: []uint64{9}},
		AllBlocksCleared{},
	})
	cmd := exec.Command("/usr/bin/python3", "-c", `import sys,msgpack,json
print(json.dumps(msgpack.unpackb(sys.stdin.buffer.read(), raw=False)))`)
	cmd.Stdin = strings.NewReader(string(b))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 msgpack: %v (install python3-msgpack: make fetch)", err)
	}
	var got []any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := `[1.5,[{"type":"BlockStored","block_hashes":[9223372036854775808,5],"parent_block_hash":7,"token_ids":[1,2,70000],"block_size":16,"lora_id":null,"medium":"CPU","lora_name":"ad"},{"type":"BlockRemoved","block_hashes":[9],"medium":null},{"type":"AllBlocksCleared"}],2]`
	var w []any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if g, _ := json.Marshal(got); string(g) != mustJSON(w) {
		t.Fatalf("python decoded\n%s\nwant\n%s", g, mustJSON(w))
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestTRTDrainIsJSON(t *testing.T) {
	var q TRTQueue
	q.Created(10, 0)
	q.Stored(0, false, TRTBlock{Hash: 1<<64 - 1, Tokens: []uint32{1, 2}})
	q.SkipIDs(3)
	q.Removed(4, 5)
	q.Updated(4, 0, 1)
	b := q.Drain(nil)
	var v []map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if len(v) != 4 || v[2]["event_id"].(float64) != 5 || q.Len() != 0 {
		t.Fatalf("drain %s", b)
	}
	if string(q.Drain(nil)) != "[]" {
		t.Fatal("second drain not empty")
	}
}

// TestTodaysLayoutsDecodeInPython: current vLLM's map batch and SGLang's salted EAGLE
// store, read back by Debian's msgpack, are the layouts CONTRACTS.md describes.
func TestTodaysLayoutsDecodeInPython(t *testing.T) {
	vllm := Format{Flavor: VLLM, Layout: LayoutMapBatch, DPRank: 1}
	sglang := Format{Flavor: SGLang}
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"vllm-map-batch", vllm.AppendBatch(nil, 2.5, []Event{
			BlockStored{Hashes: []uint64{3}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"},
			BlockRemoved{Hashes: []uint64{3}, Medium: "GPU"}}),
			`{"ts":2.5,"events":[{"type":"BlockStored","block_hashes":[3],"parent_block_hash":null,"token_ids":[1,2],"block_size":2,"lora_id":null,"medium":"GPU","lora_name":null},{"type":"BlockRemoved","block_hashes":[3],"medium":"GPU"}],"data_parallel_rank":1}`},
		{"sglang-salted-bigram", sglang.AppendBatch(nil, 3, []Event{
			BlockStored{Hashes: []uint64{1<<64 - 2}, TokenIDs: []uint32{7, 8, 9}, BlockSize: 2, Medium: "GPU", CacheSalt: "t", HasSalt: true, Bigram: true},
			BlockStored{Hashes: []uint64{4}, TokenIDs: []uint32{1}, BlockSize: 1, Medium: "CPU_PINNED"}}),
			`[3,[["BlockStored",[-2],null,[[7,8],[8,9]],2,null,"GPU",{"cache_salt":"t"}],["BlockStored",[4],null,[1],1,null,"CPU_PINNED"]],0]`},
	} {
		cmd := exec.Command("/usr/bin/python3", "-c", `import sys,msgpack,json
print(json.dumps(msgpack.unpackb(sys.stdin.buffer.read(), raw=False)))`)
		cmd.Stdin = strings.NewReader(string(c.b))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("python3 msgpack: %v (install python3-msgpack: make fetch)", err)
		}
		var got, want any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(c.want), &want); err != nil {
			t.Fatal(err)
		}
		if mustJSON(got) != mustJSON(want) {
			t.Errorf("%s: python decoded\n%s\nwant\n%s", c.name, mustJSON(got), mustJSON(want))
		}
	}
}
