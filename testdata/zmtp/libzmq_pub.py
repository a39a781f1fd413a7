#!/usr/bin/python3
"""A libzmq (pyzmq) PUB for internal/zmtp's interop test, publishing vLLM-shaped event
messages: [topic, seq (8 octets, big-endian), msgpack batch].

  argv: ADDR N HEARTBEAT_MS IDLE_MS
  stdout: "ready" once bound; "sent N SHA256" after the run (the digest of every
  kv-events payload, in order).
  stdin:  a first line "go" ends the probing; EOF ends the script.

Until "go", it publishes probes [b"kv-events", 0xff*8, b"probe"] every 5 ms (a PUB drops
what it sends before a subscription arrives). Then it stays silent for IDLE_MS, except for
libzmq's own heartbeats (ZMQ_HEARTBEAT_IVL = HEARTBEAT_MS, with a timeout of 5x that: a
subscriber that does not answer PING with PONG is disconnected, and the messages after
the silence are lost). Then N messages on b"kv-events", each preceded by one on b"other"
(the subscriber must never see those: filtering happens at the PUB), and finally
[b"kv-events", 0xff*8, b"end"].
"""
import hashlib
import os
import select
import sys
import time

import msgpack
import zmq

addr, n, hb, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ctx = zmq.Context.instance()
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 0)  # never drop: the test counts every message
if hb > 0:
    pub.setsockopt(zmq.HEARTBEAT_IVL, hb)
    pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5 * hb)
pub.bind(addr)
print("ready", flush=True)
PROBE = b"\xff" * 8
while not select.select([0], [], [], 0.005)[0]:
    pub.send_multipart([b"kv-events", PROBE, b"probe"])
os.read(0, 16)
time.sleep(idle / 1000.0)


def batch(i):
    # A BlockStored of a few blocks with their token ids: from ~60 octets (short frames)
    # to ~200 kB (long frames), as vLLM's array-like msgpack layout.
    blocks = [1, 2, 3, 64, 4096][i % 5]
    hashes = [(i << 20) + j for j in range(blocks)]
    tokens = [(i * 7919 + j) % 151000 for j in range(16 * blocks)]
    ev = ["BlockStored", hashes, None, tokens, 16, None, "GPU", None]
    return msgpack.packb([1.5 + i, [ev], 0])


h = hashlib.sha256()
for i in range(n):
    pub.send_multipart([b"other", i.to_bytes(8, "big"), b"not subscribed"])
    p = batch(i)
    h.update(p)
    pub.send_multipart([b"kv-events", i.to_bytes(8, "big"), p])
pub.send_multipart([b"kv-events", PROBE, b"end"])
print("sent %d %s" % (n, h.hexdigest()), flush=True)
sys.stdin.read()
pub.close(linger=0)
