#!/usr/bin/env python3
"""A user-space emulated link between two network namespaces (the kernel here has no
sch_netem): one TAP device in each namespace, frames forwarded by this process through a
drop-tail bottleneck queue of a given rate, then a fixed one-way delay.

    python3 link.py --ns-a NS1 --tap-a tapa --ns-b NS2 --tap-b tapb \
        --delay-ms 50 --rate-mbit 20 --queue-pkts 200

SIGUSR1 starts a blackout (every frame in both directions is dropped), SIGUSR2 ends it.
Prints "ready" once both TAPs exist; SIGTERM stops it and prints per-direction counters.
Standard library only.
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000


def open_tap(ns: str, name: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    nsfd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    if libc.setns(nsfd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")
    os.close(nsfd)
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns-a", required=True)
    ap.add_argument("--tap-a", required=True)
    ap.add_argument("--ns-b", required=True)
    ap.add_argument("--tap-b", required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each direction")
    ap.add_argument("--rate-mbit", type=float, default=0.0, help="bottleneck rate (0: none)")
    ap.add_argument("--queue-pkts", type=int, default=1000, help="bottleneck queue (drop-tail)")
    args = ap.parse_args()

    fa = open_tap(args.ns_a, args.tap_a)
    fb = open_tap(args.ns_b, args.tap_b)
    delay = args.delay_ms / 1000.0
    rate = args.rate_mbit * 1e6 / 8 if args.rate_mbit > 0 else 0.0
    state = {"blackout": False, "stop": False}
    dirs = {fa: dict(out=fb, busy_until=0.0, queued=0, fwd=0, drop_q=0, drop_bo=0),
            fb: dict(out=fa, busy_until=0.0, queued=0, fwd=0, drop_q=0, drop_bo=0)}

    def on_sig(signum, _frame):
        if signum == signal.SIGUSR1:
            state["blackout"] = True
        elif signum == signal.SIGUSR2:
            state["blackout"] = False
        else:
            state["stop"] = True

    for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_sig)
    print("ready", flush=True)

    heap: list = []   # (deliver_at, seq, in_fd, frame, leaves_queue_at)
    seq = 0
    while not state["stop"]:
        now = time.monotonic()
        # deliver due frames
        while heap and heap[0][0] <= now:
            _, _, in_fd, frame, _ = heapq.heappop(heap)
            d = dirs[in_fd]
            d["queued"] -= 1
            try:
                os.write(d["out"], frame)
                d["fwd"] += 1
            except OSError:
                pass
        timeout = max(0.0, heap[0][0] - now) if heap else 0.2
        try:
            ready, _, _ = select.select([fa, fb], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in ready:
            d = dirs[fd]
            while True:
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if state["blackout"]:
                    d["drop_bo"] += 1
                    continue
                # drop-tail: the backlog still waiting for the bottleneck, in full-size frames
                if rate and (d["busy_until"] - now) * rate > args.queue_pkts * 1514:
                    d["drop_q"] += 1
                    continue
                if rate:
                    start = max(now, d["busy_until"])
                    d["busy_until"] = start + len(frame) / rate
                    leave = d["busy_until"]
                else:
                    leave = now
                d["queued"] += 1
                seq += 1
                heapq.heappush(heap, (leave + delay, seq, fd, frame, leave))
    for fd, name in ((fa, "a->b"), (fb, "b->a")):
        d = dirs[fd]
        print(f"{name} forwarded={d['fwd']} dropped_queue={d['drop_q']} "
              f"dropped_blackout={d['drop_bo']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
