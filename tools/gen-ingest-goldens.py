#!/usr/bin/python3
"""Golden engine-event batches for ingest/, encoded by Debian's msgpack (an encoder
independent of kvgate's), with the values each batch was built from as the expectation.

Writes testdata/ingest/batches.json: a list of cases
  {name, flavor, payload (hex), error (bool), ts, dp_rank, events: [...]}
and testdata/ingest/attest.json: BlockStored streams whose keys are computed here with
hashlib + cbor2 (vLLM sha256_cbor) and hashlib (SGLang), for parity attestation tests.
"""
import hashlib
import json
import os

import cbor2
import msgpack

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "ingest")
M64 = (1 << 64) - 1

STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window"]


def u64(v):
    return str(v & M64)


def stored(hashes, parent, tokens, bs, medium=None, lora=None, extra=None, group=None,
           kind=None, window=None, lora_id=None):
    return {"kind": "stored", "vals": [hashes, parent, tokens, bs, lora_id, medium, lora,
                                       extra, group, kind, window]}


def removed(hashes, medium=None, group=None):
    return {"kind": "removed", "vals": [hashes, medium, group]}


def cleared():
    return {"kind": "cleared", "vals": []}


def unknown(*vals):
    return {"kind": "unknown", "vals": list(vals)}


def hash_value(h, enc, flavor):
    """The wire value of a 64-bit key h in encoding enc."""
    if enc == "uint":
        return h & M64
    if enc == "int64":
        v = h & M64
        return v - (1 << 64) if v >= 1 << 63 else v
    if enc == "bin":
        k = (h & M64).to_bytes(8, "big")
        if flavor == "sglang":
            return k + bytes(range(100, 124))
        return bytes(range(200, 224)) + k
    raise ValueError(enc)


def wire_event(ev, layout, nfields, enc, flavor):
    k = ev["kind"]
    vals = list(ev["vals"])
    if k in ("stored", "removed"):
        vals[0] = [hash_value(h, enc, flavor) for h in vals[0]]
    if k == "stored" and vals[1] is not None:
        vals[1] = hash_value(vals[1], enc, flavor)
    tag = {"stored": "BlockStored", "removed": "BlockRemoved", "cleared": "AllBlocksCleared",
           "unknown": "FutureEvent"}[k]
    if layout == "array":
        if k == "stored":
            return [tag] + vals[:nfields]
        if k == "removed":
            return [tag] + vals[:nfields]
        return [tag] + vals
    names = {"stored": STORED_FIELDS, "removed": ["block_hashes", "medium", "group_idx"],
             "cleared": [], "unknown": ["a", "b", "c"]}[k]
    m = {"type": tag}
    for name, v in zip(names, vals):
        if v is None and name in ("extra_keys", "group_idx", "kv_cache_spec_kind",
                                  "kv_cache_spec_sliding_window"):
            continue  # msgspec omits null defaults
        m[name] = v
    if k == "stored":
        m["locality"] = None  # a field kvgate does not know must be skipped
    return m


def expect_event(ev, layout, nfields):
    k = ev["kind"]
    vals = ev["vals"]
    if layout == "array" and k in ("stored", "removed"):
        vals = vals[:nfields] + [None] * (len(vals) - nfields)
    out = {"kind": k}
    if k == "stored":
        hashes, parent, tokens, bs, _lid, medium, lora, extra, group, kind, window = vals[:11]
        out.update(hashes=[u64(h) for h in hashes], has_parent=parent is not None,
                   parent=u64(parent) if parent is not None else "0", tokens=tokens,
                   block_size=bs, medium=medium or "GPU", lora_name=lora or "",
                   has_extra_keys=extra is not None)
        if group is not None:
            out["group"] = group
        if kind is not None:
            out["spec_kind"] = kind
        if window is not None:
            out["sliding_window"] = window
    elif k == "removed":
        out.update(hashes=[u64(h) for h in vals[0]], medium=vals[1] or "GPU")
        if vals[2] is not None:
            out["group"] = vals[2]
    return out


cases = []


def case(name, flavor, events, layout="array", nstored=11, nremoved=3, enc="uint",
         dp_rank=0, with_rank=True, ts=1764500000.25):
    wire = []
    exp = []
    for ev in events:
        n = nstored if ev["kind"] == "stored" else nremoved
        wire.append(wire_event(ev, layout, n, enc, flavor))
        exp.append(expect_event(ev, layout, n))
    batch = [ts, wire, dp_rank] if with_rank else [ts, wire]
    payload = msgpack.packb(batch, use_bin_type=True)
    cases.append({"name": name, "flavor": flavor, "payload": payload.hex(), "error": False,
                  "ts": ts, "dp_rank": dp_rank if with_rank else -1, "events": exp})


BIG = [0xFEDCBA9876543210, 0x8000000000000000, 0xFFFFFFFFFFFFFFFF]
SMALL = [1, 127, 128, 255, 256, 65535, 65536, 0xFFFFFFFF, 0x100000000]
toks = list(range(100, 116))
toks2 = [0, 1, 127, 128, 255, 256, 65535, 65536, 151643, 200000, 7, 8, 9, 10, 11, 12]
mixed = [
    stored(BIG, None, toks + toks2 + toks, 16),
    stored(SMALL[:2], BIG[0], toks + toks2, 16, medium="CPU"),
    removed(BIG[:2]),
    removed([42], medium="STORAGE"),
    cleared(),
]
for layout in ("array", "map"):
    for enc in ("uint", "int64", "bin"):
        case(f"vllm-{layout}-{enc}", "vllm", mixed, layout=layout, enc=enc, dp_rank=3)
# Every array field-count variant of BlockStored (v0.9 = 5 ... full = 11) and BlockRemoved.
for n in range(5, 12):
    case(f"vllm-array-stored{n}", "vllm", [
        stored(BIG, 77, toks * 3, 16, medium="STORAGE", lora="adapter-a",
               extra=[["adapter-a"], None, ["adapter-a"]], group=0, kind="full_attention",
               window=None, lora_id=3)], nstored=n)
for n in range(1, 4):
    case(f"vllm-array-removed{n}", "vllm", [removed(SMALL, medium="CPU", group=1)], nremoved=n)
case("vllm-v09-no-rank", "vllm", [stored([5, 6], None, toks * 2, 16), removed([5])],
     nstored=5, nremoved=1, with_rank=False)
case("vllm-unknown-tag", "vllm", [unknown(1, [2, {"x": b"y"}], None), stored([9], 8, toks, 16),
                                  unknown()], dp_rank=1)
case("vllm-map-unknown-tag", "vllm", [unknown(1, 2, 3), removed([1])], layout="map")
case("vllm-offload-empty", "vllm", [stored([11, 12], None, [], 0, medium="CPU")], nstored=7)
case("vllm-empty-batch", "vllm", [], dp_rank=0)
case("vllm-lora-map", "vllm", [stored([1, 2], None, toks * 2, 16, lora="sql-lora")], layout="map")
SG = [-3488128144981237669, 5, -1, -(1 << 63), (1 << 63) - 1]
for enc in ("uint", "bin"):
    case(f"sglang-array-{enc}", "sglang", [
        stored(SG, None, [1, 2, 3, 4] * 5, 4, medium="GPU"),
        stored([7], -9, [5, 6, 7, 8], 4),
        removed(SG[:2], medium="GPU"),
        cleared()], nstored=6, nremoved=2, enc=enc, dp_rank=0)
case("sglang-map", "sglang", [stored(SG[:1], None, [1, 2, 3, 4], 4), removed([-1])],
     layout="map", dp_rank=2)


# ---- today's engines, laid out the way their msgspec encoders write them ---------------
def raw_case(name, flavor, batch, events, ts, dp_rank):
    """A batch built as Python objects (msgspec's layout written out by hand), packed by
    msgpack; events is the decoder's expected output."""
    cases.append({"name": name, "flavor": flavor, "error": False, "ts": ts, "dp_rank": dp_rank,
                  "payload": msgpack.packb(batch, use_bin_type=True).hex(), "events": events})


def exp_stored(hashes, parent, tokens, bs, medium="GPU", lora="", extra=False, **kw):
    out = {"kind": "stored", "hashes": [u64(h) for h in hashes], "has_parent": parent is not None,
           "parent": u64(parent) if parent is not None else "0", "tokens": tokens,
           "block_size": bs, "medium": medium, "lora_name": lora, "has_extra_keys": extra}
    out.update(kw)
    return out


def exp_removed(hashes, medium="GPU", **kw):
    out = {"kind": "removed", "hashes": [u64(h) for h in hashes], "medium": medium}
    out.update(kw)
    return out


# SGLang (disaggregation/kv_events.py): EventBatch and KVCacheEvent are array_like tagged
# structs without omit_defaults, so every field is written, medium included. A salted
# store is BlockStoredWithMetadata: the same tag, plus its kw_only metadata struct (a
# plain msgspec Struct, so a map) as the 8th element. EAGLE stores carry bigram pairs.
SALT = "tenant-\u00e9\x00x"
raw_case("sglang-salted-store", "sglang", [1764500001.5, [
    ["BlockStored", [SG[0], SG[1]], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU"],
    ["BlockStored", [SG[2]], None, [9, 10, 11, 12], 4, None, "GPU", {"cache_salt": SALT}],
    ["BlockStored", [SG[3]], SG[2], [13, 14, 15, 16], 4, None, "CPU_PINNED", {"cache_salt": ""}],
    ["BlockRemoved", [SG[0]], "GPU"],
    ["BlockRemoved", [SG[3]], "CPU_PINNED"],
    ["BlockRemoved", [SG[4]], "DISK"],
    ["BlockRemoved", [SG[4]], "EXTERNAL"],
    ["AllBlocksCleared"]], 1], [
    exp_stored(SG[:2], None, [1, 2, 3, 4, 5, 6, 7, 8], 4),
    exp_stored([SG[2]], None, [9, 10, 11, 12], 4, has_salt=True, cache_salt=SALT),
    exp_stored([SG[3]], SG[2], [13, 14, 15, 16], 4, medium="CPU", has_salt=True, cache_salt=""),
    exp_removed([SG[0]]), exp_removed([SG[3]], medium="CPU"), exp_removed([SG[4]], medium="STORAGE"),
    exp_removed([SG[4]], medium="EXTERNAL"), {"kind": "cleared"}], 1764500001.5, 1)
raw_case("sglang-bigram-store", "sglang", [2.0, [
    ["BlockStored", [SG[0], SG[1]], None, [[1, 2], [2, 3], [3, 4], [4, 5]], 2, None, "GPU"],
    ["BlockStored", [SG[2]], SG[1], [[5, 6], [6, 151643]], 2, None, "GPU", {"cache_salt": "s"}]], 0], [
    exp_stored(SG[:2], None, [1, 2, 2, 3, 3, 4, 4, 5], 2, bigram=True),
    exp_stored([SG[2]], SG[1], [5, 6, 6, 151643], 2, bigram=True, has_salt=True, cache_salt="s")],
    2.0, 0)

# SGLang component-typed stores (BlockStoredWithComponentType, the newer events
# recorder): component_type's position relative to medium is not pinned yet; both orders
# decode to the same medium and component.
raw_case("sglang-component-types", "sglang", [9.0, [
    ["BlockStored", [SG[0]], None, [1, 2, 3, 4], 4, None, "GPU", "FULL"],
    ["BlockStored", [SG[0]], None, [1, 2, 3, 4], 4, None, "MAMBA", "GPU"],
    ["BlockStored", [SG[1]], None, [5, 6, 7, 8], 4, None, "GPU", "SWA", {"cache_salt": "s"}],
    ["BlockRemoved", [SG[0]], "GPU", "MAMBA"],
    ["BlockRemoved", [SG[0]], "MAMBA", "CPU_PINNED"]], 0], [
    exp_stored([SG[0]], None, [1, 2, 3, 4], 4, component="FULL"),
    exp_stored([SG[0]], None, [1, 2, 3, 4], 4, component="MAMBA"),
    exp_stored([SG[1]], None, [5, 6, 7, 8], 4, component="SWA", has_salt=True, cache_salt="s"),
    exp_removed([SG[0]], component="MAMBA"), exp_removed([SG[0]], medium="CPU", component="MAMBA")],
    9.0, 0)

# vLLM (distributed/kv_events.py at 0181ea3): EventBatch and KVCacheEvent are tagged
# structs with omit_defaults and no array_like: the batch is a map, every event a map
# whose "type" comes first; fields without a default (lora_id, medium, lora_name) are
# always written, null defaults (extra_keys, group_idx, kv_cache_spec_*) are omitted.
def vllm_stored_map(hashes, parent, tokens, bs, medium="GPU", lora=None, extra=None,
                    group=None, kind=None, window=None):
    m = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
         "token_ids": tokens, "block_size": bs, "lora_id": None, "medium": medium,
         "lora_name": lora}
    for k, v in (("extra_keys", extra), ("group_idx", group), ("kv_cache_spec_kind", kind),
                 ("kv_cache_spec_sliding_window", window)):
        if v is not None:
            m[k] = v
    return m


def vllm_removed_map(hashes, medium="GPU", group=None):
    m = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group is not None:
        m["group_idx"] = group
    return m


raw_case("vllm-map-batch", "vllm", {"ts": 1764500002.0, "events": [
    vllm_stored_map(BIG[:2], None, toks * 2, 16),
    vllm_stored_map(BIG[2:], BIG[1], toks, 16, medium="CPU", extra=[["sql-lora"]], lora="sql-lora"),
    vllm_removed_map(BIG[:1])], "data_parallel_rank": 2}, [
    exp_stored(BIG[:2], None, toks * 2, 16),
    exp_stored(BIG[2:], BIG[1], toks, 16, medium="CPU", lora="sql-lora", extra=True),
    exp_removed(BIG[:1])], 1764500002.0, 2)
# A batch map whose rank comes before its events, and one without a rank.
raw_case("vllm-map-batch-rank-first", "vllm", {"data_parallel_rank": 5, "ts": 3.0, "events": [
    vllm_removed_map([1, 2])]}, [exp_removed([1, 2])], 3.0, 5)
raw_case("vllm-map-batch-no-rank", "vllm", {"ts": 4.0, "events": [vllm_removed_map([3])]},
         [exp_removed([3])], 4.0, -1)
# Hybrid KV groups: a sliding-window model (Gemma-style: group 0 full attention, group 1
# sliding window 1024) and a mamba hybrid (group 0 full attention, group 1 mamba).
raw_case("vllm-hybrid-sliding-window", "vllm", {"ts": 5.0, "events": [
    vllm_stored_map([11, 12], None, toks * 2, 16, group=0, kind="full_attention"),
    vllm_stored_map([11, 12], None, toks * 2, 16, group=1, kind="sliding_window", window=1024),
    vllm_removed_map([11], group=1)], "data_parallel_rank": 0}, [
    exp_stored([11, 12], None, toks * 2, 16, group=0, spec_kind="full_attention"),
    exp_stored([11, 12], None, toks * 2, 16, group=1, spec_kind="sliding_window", sliding_window=1024),
    exp_removed([11], group=1)], 5.0, 0)
raw_case("vllm-hybrid-mamba", "vllm", {"ts": 6.0, "events": [
    vllm_stored_map([21, 22, 23, 24], None, toks * 4, 16, group=0, kind="full_attention"),
    vllm_stored_map([22, 24], None, toks * 4, 32, group=1, kind="mamba"),
    vllm_removed_map([22], group=0)], "data_parallel_rank": 0}, [
    exp_stored([21, 22, 23, 24], None, toks * 4, 16, group=0, spec_kind="full_attention"),
    exp_stored([22, 24], None, toks * 4, 32, group=1, spec_kind="mamba"),
    exp_removed([22], group=0)], 6.0, 0)

# A bad event costs only itself: each undecodable event comes back as "invalid" and the
# events after it still decode, in both engines' layouts.
raw_case("bad-event-mid-batch-vllm", "vllm", {"ts": 7.0, "events": [
    vllm_stored_map([1], None, toks, 16),
    vllm_removed_map([{"not": "a hash"}]),
    vllm_stored_map([2], None, [-1] + toks[1:], 16),
    vllm_stored_map([3], None, toks, 1 << 40),
    {"type": "BlockStored", "block_hashes": [4], "token_ids": "xyz"},
    vllm_removed_map([1])], "data_parallel_rank": 0}, [
    exp_stored([1], None, toks, 16), {"kind": "invalid", "bad": "type"},
    {"kind": "invalid", "bad": "range"}, {"kind": "invalid", "bad": "range"},
    {"kind": "invalid", "bad": "type"}, exp_removed([1])], 7.0, 0)
raw_case("bad-event-mid-batch-sglang", "sglang", [8.0, [
    ["BlockStored", [SG[0]], None, [1, 2, 3, 4], 4, None, "GPU", {"cache_salt": 5}],
    ["BlockStored", [SG[1]], None, [[1, 2], 3], 4, None, "GPU"],
    ["BlockStored", [SG[2]], None, [[1, 2, 3]], 1, None, "GPU"],
    ["BlockRemoved", [SG[0]], 7],
    ["BlockRemoved", [SG[1]], "GPU"]], 0], [
    {"kind": "invalid", "bad": "type"}, {"kind": "invalid", "bad": "type"},
    {"kind": "invalid", "bad": "type"}, {"kind": "invalid", "bad": "type"},
    exp_removed([SG[1]])], 8.0, 0)
raw_case("bad-hash-string", "vllm", [1.0, [["BlockStored", ["x"], None, [], 16]], 0],
         [{"kind": "invalid", "bad": "type"}], 1.0, 0)
raw_case("bad-token-negative", "vllm", [1.0, [["BlockStored", [1], None, [-1], 16]], 0],
         [{"kind": "invalid", "bad": "range"}], 1.0, 0)
raw_case("bad-bin-hash-short", "vllm", [1.0, [["BlockRemoved", [b"abc"]]], 0],
         [{"kind": "invalid", "bad": "type"}], 1.0, 0)

# Malformed payloads: the decoder reports an error and never panics.
good = bytes.fromhex(cases[0]["payload"])
bad = {
    "truncated": good[: len(good) // 2],
    "empty": b"",
    "not-array": msgpack.packb({"a": 1}),
    "ts-string": msgpack.packb(["x", [], 0]),
    "events-not-array": msgpack.packb([1.0, 5, 0]),
    "short-batch": msgpack.packb([1.0]),
    "huge-array-head": bytes([0x93, 0xcb]) + bytes(8) + bytes([0xdd, 0xff, 0xff, 0xff, 0xff]),
    "reserved-c1": bytes([0x93, 0xcb]) + bytes(8) + bytes([0x91, 0x92, 0xa1, 0x58, 0xc1]),
    "map-no-events": msgpack.packb({"ts": 1.0, "data_parallel_rank": 0}),
    "map-events-not-array": msgpack.packb({"ts": 1.0, "events": 3}),
    # An event truncated inside: its batch's structure is broken, nothing after it exists.
    "event-truncated": msgpack.packb([1.0, [["BlockRemoved", [1, 2, 3]]], 0])[:-3],
}
for name, p in bad.items():
    cases.append({"name": "bad-" + name, "flavor": "vllm", "payload": p.hex(), "error": True})


# ---- parity attestation streams -------------------------------------------------------
def vllm_none_hash(seed):
    return hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()


def vllm_block(parent, tokens, extra):
    return hashlib.sha256(cbor2.dumps((parent, tuple(tokens), extra), canonical=True)).digest()


def vllm_chain(tokens, bs, seed="vllm-none-hash", lora=None, parent=None):
    parent = parent or vllm_none_hash(seed)
    keys, digests = [], []
    extra = (lora,) if lora else None
    for i in range(0, len(tokens) - len(tokens) % bs, bs):
        parent = vllm_block(parent, tokens[i:i + bs], extra)
        digests.append(parent)
        keys.append(int.from_bytes(parent, "big") & M64)
    return keys, digests


nh = vllm_none_hash("vllm-none-hash")
assert nh.hex() == "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
k, d = vllm_chain([1, 2, 3, 4], 4)
assert d[0].hex() == "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111"
assert k[0] == 9561501211280363793


def sglang_chain(tokens, page, parent=None):
    keys, digests = [], []
    for i in range(0, len(tokens) - len(tokens) % page, page):
        h = hashlib.sha256()
        if parent is not None:
            h.update(parent)
        for t in tokens[i:i + page]:
            h.update(t.to_bytes(4, "little"))
        parent = h.digest()
        digests.append(parent)
        keys.append(int.from_bytes(parent[:8], "big", signed=True) & M64)
    return keys, digests


k, _ = sglang_chain([1, 2, 3, 4], 4)
assert k[0] == (-3488128144981237669) & M64

streams = []


def vllm_stream(name, bs, seed, engine_seed, lora=None):
    """Three batches: a root event, a child event continuing its chain, and an eviction.
    Keys are computed with engine_seed; the rule uses seed (a mismatch when they differ)."""
    a = [(7 * i + 3) % 50000 for i in range(3 * bs)]
    b = [(11 * i + 5) % 50000 for i in range(2 * bs)]
    ka, da = vllm_chain(a, bs, engine_seed, lora)
    kb, _ = vllm_chain(b, bs, engine_seed, lora, parent=da[-1])
    # A branch from the middle of the first event: parent is a's block 0.
    c = [(13 * i + 1) % 50000 for i in range(bs)]
    kc, _ = vllm_chain(c, bs, engine_seed, lora, parent=da[0])
    evs = [
        {"kind": "stored", "hashes": [u64(x) for x in ka], "parent": None, "tokens": a,
         "block_size": bs, "lora_name": lora or ""},
        {"kind": "stored", "hashes": [u64(x) for x in kb], "parent": u64(ka[-1]), "tokens": b,
         "block_size": bs, "lora_name": lora or ""},
        {"kind": "stored", "hashes": [u64(x) for x in kc], "parent": u64(ka[0]), "tokens": c,
         "block_size": bs, "lora_name": lora or ""},
        {"kind": "removed", "hashes": [u64(kb[-1])]},
    ]
    streams.append({"name": name, "engine": "vllm", "algo": "sha256_cbor", "block_size": bs,
                    "seed": seed, "events": evs})


vllm_stream("vllm-ok", 16, "vllm-none-hash", "vllm-none-hash")
vllm_stream("vllm-ok-lora", 16, "vllm-none-hash", "vllm-none-hash", lora="sql-lora")
vllm_stream("vllm-seed-mismatch", 16, "vllm-none-hash", "1234")


def sglang_stream(name, page):
    a = [(3 * i + 1) % 30000 for i in range(4 * page)]
    ka, da = sglang_chain(a, page)
    evs = []
    # SGLang publishes one BlockStored per page.
    for i in range(len(ka)):
        evs.append({"kind": "stored", "hashes": [u64(ka[i])],
                    "parent": u64(ka[i - 1]) if i else None,
                    "tokens": a[i * page:(i + 1) * page], "block_size": page, "lora_name": ""})
    evs.append({"kind": "removed", "hashes": [u64(ka[-1])]})
    streams.append({"name": name, "engine": "sglang", "algo": "sha256", "block_size": page,
                    "seed": "", "events": evs})


sglang_stream("sglang-ok", 4)

# ---- SGLang salted and EAGLE bigram streams, as raw payloads -------------------------
# SGLang's page hash (mem_cache/utils.py + cpp_utils/hash_binding.cpp, see
# tools/gen-sglang-goldens.py): a salted chain starts from sha256(b"sglang-cache-salt-v1\0"
# + salt); a bigram page hashes both tokens of each pair. Events are laid out as SGLang's
# msgspec encoder writes them: [tag, hashes, parent, token_ids, block_size, lora_id,
# medium(, {"cache_salt": s})], coalesced stores carrying several pages.
def sglang_pages(tokens, page, salt=None, bigram=False):
    units = [(tokens[i], tokens[i + 1]) for i in range(len(tokens) - 1)] if bigram else list(tokens)
    prior = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).digest() if salt is not None else None
    keys = []
    for i in range(0, len(units) - len(units) % page, page):
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        for u in units[i:i + page]:
            for w in (u if bigram else (u,)):
                h.update(w.to_bytes(4, "little"))
        prior = h.digest()
        keys.append(int.from_bytes(prior[:8], "big", signed=True))
    return keys, units


def sglang_raw_stream(name, page, salt, bigram, rule_bigram):
    n_pages = 5
    toks = [(17 * i + 3) % 40000 for i in range(n_pages * page + (1 if bigram else 0))]
    keys, units = sglang_pages(toks, page, salt, bigram)
    assert len(keys) == n_pages
    tail = [{"cache_salt": salt}] if salt is not None else []

    def ev(lo, hi, parent):
        tk = [list(u) for u in units[lo * page:hi * page]] if bigram else units[lo * page:hi * page]
        return ["BlockStored", keys[lo:hi], parent, tk, page, None, "GPU"] + tail

    batches = [[1.0, [ev(0, 3, None)], 0], [2.0, [ev(3, 5, keys[2])], 0],
               [3.0, [["BlockRemoved", [keys[4]], "GPU"]], 0]]
    sg_streams.append({"name": name, "block_size": page, "bigram": rule_bigram, "salt": salt or "",
                       "payloads": [msgpack.packb(b).hex() for b in batches],
                       "tokens": toks[:4 * page + (1 if bigram else 0)],
                       "live": [u64(k) for k in keys[:4]], "stored_events": 2})


sg_streams = []
sglang_raw_stream("salted", 4, "tenant-a", False, False)
sglang_raw_stream("bigram", 4, None, True, True)
sglang_raw_stream("salted-bigram", 2, "t\u00e9nant", True, True)
sglang_raw_stream("bigram-rule-plain", 4, None, True, False)  # the rule misses Bigram
with open(os.path.join(ROOT, "sglang_streams.json"), "w") as f:
    json.dump(sg_streams, f, indent=1)
    f.write("\n")

# ---- holder counting: offload chunks, duplicate blocks, hybrid KV cache groups -------
# Each stream is a list of vLLM batches (map layout, as distributed/kv_events.py at
# 0181ea3 encodes them) and what the inventory and tier counts must be afterwards, from
# a model here: a hash stays on a tier while it has a holder (a store not yet removed).
def holder_model(batches, routed):
    held = {}  # (hash, medium) -> holders
    for b in batches:
        for ev in b["events"]:
            med = ev.get("medium") or "GPU"
            for h in ev.get("block_hashes", []):
                k = (h & M64, med)
                if ev["type"] == "BlockStored":
                    held[k] = held.get(k, 0) + 1
                elif ev["type"] == "BlockRemoved" and held.get(k):
                    held[k] -= 1
                    if not held[k]:
                        del held[k]
    keys = sorted({h for (h, med) in held if med in routed})
    tiers = {}
    for (h, med) in held:
        tiers[med] = tiers.get(med, 0) + 1
    return [u64(k) for k in keys], tiers


hold_streams = []


def hold_stream(name, batches, routed=("GPU",), bs=16, stored_with_tokens=0):
    keys, tiers = holder_model(batches, routed)
    hold_streams.append({"name": name, "routed": list(routed), "block_size": bs,
                         "payloads": [msgpack.packb(b).hex() for b in batches],
                         "keys": keys, "tiers": tiers, "attested": stored_with_tokens})


def vb(*events):
    return {"ts": 1.0, "events": list(events), "data_parallel_rank": 0}


# Offload: the CPU tier announces a hash once per chunk (two chunks of one block), the
# GPU copy is evicted first, then each chunk's copy.
H1, H2 = 0xA1, 0xA2
offload = [vb(vllm_stored_map([H1, H2], None, toks * 2, 16)),
           vb(vllm_stored_map([H1], None, [], 0, medium="CPU"),
              vllm_stored_map([H1], None, [], 0, medium="CPU")),
           vb(vllm_removed_map([H1]))]
hold_stream("offload-gpu-evicted", offload)
hold_stream("offload-gpu-evicted-cpu-routed", offload, routed=("GPU", "CPU"))
hold_stream("offload-one-chunk-gone", offload + [vb(vllm_removed_map([H1], medium="CPU"))],
            routed=("GPU", "CPU"))
hold_stream("offload-all-gone", offload + [vb(vllm_removed_map([H1], medium="CPU"),
                                              vllm_removed_map([H1], medium="CPU"))],
            routed=("GPU", "CPU"))
# vLLM does not de-duplicate identical blocks: two stores, two evictions.
dup = [vb(vllm_stored_map([H1], None, toks, 16), vllm_stored_map([H1], None, toks, 16)),
       vb(vllm_removed_map([H1]))]
hold_stream("duplicate-block-one-evicted", dup)
hold_stream("duplicate-block-both-evicted", dup + [vb(vllm_removed_map([H1]))])
hold_stream("remove-unknown", [vb(vllm_removed_map([0xDEAD]))])

# Hybrid models, keys from the vLLM sha256_cbor chain (hash block size 16), so that
# attestation runs on every store. A group whose block size is k x 16 publishes, for
# each of its blocks, the 16-token chain's key at the block's last 16-token boundary
# (kv_cache_utils.BlockHashListWithBlockSize), with all of the block's tokens.
seq = [(29 * i + 7) % 32000 for i in range(128)]
hk, hd = vllm_chain(seq, 16)
# Sliding window (Gemma-style): group 0 full attention, group 1 sliding window 32; the
# window group frees blocks that slid out, full attention keeps them.
sw = [vb(vllm_stored_map(hk[:4], None, seq[:64], 16, group=0, kind="full_attention"),
         vllm_stored_map(hk[:4], None, seq[:64], 16, group=1, kind="sliding_window", window=32)),
      vb(vllm_removed_map(hk[:2], group=1)),
      vb(vllm_removed_map(hk[3:4], group=0)),
      vb(vllm_stored_map(hk[4:6], hk[3], seq[64:96], 16, group=0, kind="full_attention"))]
hold_stream("hybrid-sliding-window", sw, stored_with_tokens=3)
hold_stream("hybrid-sliding-window-both-gone", sw + [vb(vllm_removed_map(hk[3:4], group=1))],
            stored_with_tokens=3)
# Mamba hybrid: group 0 full attention (16-token blocks), group 1 mamba with 32-token
# blocks: its keys are every second 16-token key; a second store chains on its parent.
mamba = [vb(vllm_stored_map(hk[:4], None, seq[:64], 16, group=0, kind="full_attention"),
            vllm_stored_map([hk[1], hk[3]], None, seq[:64], 32, group=1, kind="mamba"),
            vllm_stored_map([hk[5], hk[7]], hk[3], seq[64:128], 32, group=1, kind="mamba")),
         vb(vllm_removed_map([hk[1]], group=0))]
hold_stream("hybrid-mamba", mamba, stored_with_tokens=3)
hold_stream("hybrid-mamba-both-gone", mamba + [vb(vllm_removed_map([hk[1]], group=1))],
            stored_with_tokens=3)
with open(os.path.join(ROOT, "holders.json"), "w") as f:
    json.dump(hold_streams, f, indent=1)
    f.write("\n")

# ---- TensorRT-LLM /kv_cache_events bodies (Python's json as the encoder) ---------------
def trt_stored(eid, parent, blocks, rank=None):
    ev = {"event_id": eid, "data": {"type": "stored", "parent_hash": parent, "blocks": [
        {"type": "stored_block", "block_hash": h, "tokens": [
            {"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in toks],
         "lora_id": None, "cache_level": lvl, "priority": 35, "mm_keys": [], "cache_salt": None}
        for h, toks, lvl in blocks]}, "window_size": 4096}
    if rank is not None:
        ev["attention_dp_rank"] = rank
    return ev


trt_events = [
    {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [1024, 256]},
     "window_size": 4096},
    trt_stored(1, None, [((1 << 64) - 1, list(range(8)), 0), (-5, list(range(8, 16)), 0)], rank=0),
    trt_stored(2, -5, [(1 << 63, [151643] * 8, 1)]),
    {"event_id": 3, "data": {"type": "removed", "block_hashes": [-5, 12345]}, "window_size": 4096},
    {"event_id": 4, "data": {"type": "updated", "block_hash": 1 << 63,
                             "cache_level": {"type": "event_diff", "new_value": 0, "old_value": 1},
                             "priority": None}, "window_size": 4096},
    {"event_id": 5, "data": {"type": "updated", "block_hash": 7, "cache_level": None,
                             "priority": {"type": "event_diff", "new_value": 50, "old_value": 35}},
     "window_size": 4096},
    {"event_id": 7, "data": {"type": "future_kind", "x": [1, {"y": None}]}, "window_size": 4096},
]
trt_expect = [
    {"id": 0, "type": "created"},
    {"id": 1, "type": "stored", "parent": None,
     "blocks": [[u64((1 << 64) - 1), list(range(8)), 0], [u64(-5), list(range(8, 16)), 0]]},
    {"id": 2, "type": "stored", "parent": u64(-5), "blocks": [[u64(1 << 63), [151643] * 8, 1]]},
    {"id": 3, "type": "removed", "hashes": [u64(-5), u64(12345)]},
    {"id": 4, "type": "updated", "block_hash": u64(1 << 63), "new_level": 0},
    {"id": 5, "type": "updated", "block_hash": u64(7), "new_level": None},
    {"id": 7, "type": "future_kind"},
]
trt_cases = [{"name": "all-kinds", "body": json.dumps(trt_events), "events": trt_expect},
             {"name": "empty", "body": "[]", "events": []}]
for name, body in {"not-list": '{"a":1}', "truncated": json.dumps(trt_events)[:200],
                   "hash-float": '[{"event_id":1,"data":{"type":"removed","block_hashes":[1.5]}}]',
                   "hash-huge": '[{"event_id":1,"data":{"type":"removed","block_hashes":[18446744073709551616]}}]',
                   "no-event-id": '[{"data":{"type":"created"}}]'}.items():
    trt_cases.append({"name": "bad-" + name, "body": body, "error": True})

os.makedirs(ROOT, exist_ok=True)
with open(os.path.join(ROOT, "trt.json"), "w") as f:
    json.dump(trt_cases, f, indent=1)
    f.write("\n")
with open(os.path.join(ROOT, "batches.json"), "w") as f:
    json.dump(cases, f, indent=1)
    f.write("\n")
with open(os.path.join(ROOT, "attest.json"), "w") as f:
    json.dump(streams, f, indent=1)
    f.write("\n")
print(f"gen-ingest-goldens: {len(cases)} batches, {len(streams)} attestation streams, {len(trt_cases)} trt bodies")
