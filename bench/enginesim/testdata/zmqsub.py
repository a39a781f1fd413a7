#!/usr/bin/python3
"""Independent KV-event reader for the engine simulator's tests (pyzmq + msgpack).

usage: zmqsub.py sub ADDR N          -> prints N batches received on a SUB socket
       zmqsub.py replay ADDR START   -> asks a ROUTER for batches >= START, prints them
Each line: {"seq": int, "frames": int, "batch": <msgpack payload as JSON>}; "ready" first.
"""
import json
import sys

import msgpack
import zmq


def show(seq, frames, payload):
    batch = msgpack.unpackb(payload, raw=False) if payload else None
    print(json.dumps({"seq": int.from_bytes(seq, "big"), "frames": frames, "batch": batch}), flush=True)


def main():
    mode, addr, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = zmq.Context()
    if mode == "sub":
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.setsockopt(zmq.RCVTIMEO, 20000)
        s.connect(addr)
        print("ready", flush=True)
        for _ in range(arg):
            fr = s.recv_multipart()
            show(fr[-2], len(fr), fr[-1])
    else:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.RCVTIMEO, 20000)
        s.connect(addr)
        print("ready", flush=True)
        s.send_multipart([b"", arg.to_bytes(8, "big")])
        while True:
            fr = s.recv_multipart()
            # ["", seq, payload] or ["", topic, seq, payload]
            seq, payload = fr[-2], fr[-1]
            show(seq, len(fr), payload)
            if seq == b"\xff" * 8:
                break
    ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
