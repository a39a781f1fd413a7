#!/usr/bin/python3
"""A stand-in vLLM/SGLang KV-event publisher on libzmq (pyzmq), driven by ingest's interop
test: one JSON command per stdin line, "ok" (or "error: ...") per line on stdout.

  {"cmd": "bind", "pub": ADDR, "replay": ADDR|null, "topic": T, "topic_frame": bool,
   "seq": N, "backlog": [{"layout": L, "events": [...]}, ...]}
  {"cmd": "probe"}     publish "<topic>-probe" messages until a line "go" arrives
  {"cmd": "publish", "layout": "array"|"map", "events": [...], "seq": N (optional)}
  {"cmd": "close"}     close the sockets (the engine goes away)
  {"cmd": "reset"}     seq back to 0 and an empty replay buffer (an engine restart)
  {"cmd": "exit"}

Events: {"kind": "stored", "hashes": [...], "parent": int|null, "tokens": [...],
"block_size": N} | {"kind": "removed", "hashes": [...]} | {"kind": "cleared"}.
Batches are [ts, [event...], dp_rank] packed by msgpack; frames [topic, seq(8 BE), payload].
"""
import json
import os
import select
import threading
import time

import msgpack
import zmq

ctx = zmq.Context.instance()
state = {"pub": None, "router": None, "seq": 0, "buffer": [], "topic": "", "topic_frame": False,
         "stop": None, "thread": None}
lock = threading.Lock()
END = b"\xff" * 8


def encode(layout, events):
    out = []
    for e in events:
        k = e["kind"]
        if k == "stored":
            fields = [("block_hashes", e["hashes"]), ("parent_block_hash", e.get("parent")),
                      ("token_ids", e.get("tokens", [])), ("block_size", e.get("block_size", 16)),
                      ("lora_id", None), ("medium", "GPU"), ("lora_name", None)]
            tag = "BlockStored"
        elif k == "removed":
            fields = [("block_hashes", e["hashes"]), ("medium", "GPU")]
            tag = "BlockRemoved"
        else:
            fields = []
            tag = "AllBlocksCleared"
        if layout == "map":
            m = {"type": tag}
            m.update(fields)
            out.append(m)
        else:
            out.append([tag] + [v for _, v in fields])
    return msgpack.packb([time.time(), out, 0])


def serve_replay(router, stop):
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    while not stop.is_set():
        if not poller.poll(20):
            continue
        frames = router.recv_multipart()
        ident, start = frames[0], int.from_bytes(frames[-1], "big")
        with lock:
            todo = [(s, p) for s, p in state["buffer"] if s >= start]
        for s, p in todo:
            if state["topic_frame"]:
                router.send_multipart([ident, b"", state["topic"].encode(), s.to_bytes(8, "big"), p])
            else:
                router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
        if state["topic_frame"]:
            router.send_multipart([ident, b"", b"", END, b""])
        else:
            router.send_multipart([ident, b"", END, b""])
    router.close(linger=0)


def send(payload):
    with lock:
        seq = state["seq"]
        state["seq"] += 1
        state["buffer"].append((seq, payload))
        del state["buffer"][:-10000]
    if state["pub"] is not None:
        state["pub"].send_multipart([state["topic"].encode(), seq.to_bytes(8, "big"), payload])


def close():
    if state["stop"] is not None:
        state["stop"].set()
        state["thread"].join()
        state["stop"] = None
    if state["pub"] is not None:
        state["pub"].close(linger=0)
        state["pub"] = None


class Lines:
    """Unbuffered stdin lines, so select() sees exactly what is still unread."""

    def __init__(self):
        self.buf = b""

    def ready(self, timeout):
        if b"\n" in self.buf:
            return True
        r, _, _ = select.select([0], [], [], timeout)
        if r:
            data = os.read(0, 4096)
            if not data:
                raise EOFError
            self.buf += data
        return b"\n" in self.buf

    def readline(self):
        while b"\n" not in self.buf:
            data = os.read(0, 4096)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def main():
    lines = Lines()
    while True:
        line = lines.readline()
        if line is None:
            close()
            return
        line = line.strip()
        if not line:
            continue
        try:
            c = json.loads(line)
            cmd = c["cmd"]
            if cmd == "bind":
                state["topic"] = c.get("topic", "")
                state["topic_frame"] = c.get("topic_frame", False)
                if "seq" in c:
                    state["seq"] = c["seq"]
                for b in c.get("backlog", []):
                    send(encode(b["layout"], b["events"]))
                pub = ctx.socket(zmq.PUB)
                pub.bind(c["pub"])
                state["pub"] = pub
                if c.get("replay"):
                    router = ctx.socket(zmq.ROUTER)
                    router.bind(c["replay"])
                    state["stop"] = threading.Event()
                    state["thread"] = threading.Thread(target=serve_replay,
                                                       args=(router, state["stop"]))
                    state["thread"].start()
            elif cmd == "probe":
                probe = (state["topic"] + "-probe").encode()
                while True:
                    state["pub"].send_multipart([probe, bytes(8), b""])
                    if lines.ready(0.02) and lines.readline().strip() == "go":
                        break
            elif cmd == "publish":
                if "seq" in c:
                    state["seq"] = c["seq"]
                send(encode(c.get("layout", "array"), c["events"]))
            elif cmd == "close":
                close()
            elif cmd == "reset":
                with lock:
                    state["seq"] = 0
                    state["buffer"] = []
            elif cmd == "exit":
                close()
                print("ok", flush=True)
                return
            print("ok", flush=True)
        except Exception as e:  # report, keep serving
            print("error: %r" % (e,), flush=True)


main()
