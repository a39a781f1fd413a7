#!/usr/bin/python3
"""A libzmq (pyzmq) SUB for internal/zmtp's interop test of its load-generation PUB.

  argv: ADDR TOPIC
  Connects, subscribes to TOPIC, and reads [topic, seq (8 octets), payload] messages
  until one whose seq is 0xff*8; then prints "got N SHA256 BAD" (N messages before the
  end, the digest of their payloads in order, BAD: how many had a topic not starting
  with TOPIC or seqs out of order) and exits.
"""
import hashlib
import sys

import zmq

addr, topic = sys.argv[1], sys.argv[2].encode()
ctx = zmq.Context.instance()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, topic)
sub.setsockopt(zmq.RCVTIMEO, 20000)
sub.connect(addr)
print("connected", flush=True)
h = hashlib.sha256()
n = bad = 0
while True:
    f = sub.recv_multipart()
    if len(f) != 3 or not f[0].startswith(topic):
        bad += 1
        continue
    seq = int.from_bytes(f[1], "big")
    if seq == (1 << 64) - 1:
        break
    if seq != n:
        bad += 1
    h.update(f[2])
    n += 1
print("got %d %s %d" % (n, h.hexdigest(), bad), flush=True)
sub.close(linger=0)
