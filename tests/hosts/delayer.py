#!/usr/bin/python3
"""Delays packets in user space, for kernels without `tc netem` (sch_netem): run inside a host's
network namespace, it takes every packet an iptables NFQUEUE rule hands it and lets each go after
DELAY ms, plus or minus up to JITTER ms drawn uniformly for each packet (as netem's jitter
without a distribution table: packets may overtake each other), dropping LOSS % of them at
random. hosts.py starts it (`Bed.delay`) and stops it with `heal`.

    delayer.py --queue N --delay MS [--jitter MS] [--loss PERCENT]

Prints "ready" once the queue is bound. On SIGTERM it lets every packet it holds go at once, then
exits; the rule's --queue-bypass passes packets while no delayer listens.

The kernel side is nfnetlink_queue (linux/netfilter/nfnetlink_queue.h), spoken here over a raw
netlink socket: bind the queue, ask for the packets' metadata only (their ids), answer each with
a verdict.
"""

import argparse
import heapq
import itertools
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port
NFGENMSG = struct.Struct("=BBH")  # family, version, queue number (big-endian)
NLATTR = struct.Struct("=HH")  # length, type


class Queue:
    def __init__(self, number):
        self.number = number
        self.seq = itertools.count(1)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))

    def _send(self, msg_type, attrs, flags=NLM_F_REQUEST):
        body = NFGENMSG.pack(socket.AF_UNSPEC, 0, socket.htons(self.number))
        for attr_type, data in attrs:
            length = NLATTR.size + len(data)
            body += NLATTR.pack(length, attr_type) + data + b"\0" * (-length % 4)
        seq = next(self.seq)
        self.sock.send(NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body),
                                         (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0)
                       + body)
        return seq

    def _config(self, attrs):
        seq = self._send(NFQNL_MSG_CONFIG, attrs, NLM_F_REQUEST | NLM_F_ACK)
        while True:
            for msg_type, msg_seq, payload in self._messages(self.sock.recv(65536)):
                if msg_type == NLMSG_ERROR and msg_seq == seq:
                    error = struct.unpack_from("=i", payload)[0]
                    if error != 0:
                        raise OSError(-error, "nfnetlink_queue config refused")
                    return

    def bind(self):
        self._config([(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))])
        self._config([(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))])

    @staticmethod
    def _messages(data):
        offset = 0
        while offset + NLMSG_HEADER.size <= len(data):
            length, msg_type, _, seq, _ = NLMSG_HEADER.unpack_from(data, offset)
            if length < NLMSG_HEADER.size:
                break
            yield msg_type, seq, data[offset + NLMSG_HEADER.size:offset + length]
            offset += (length + 3) & ~3

    def packet_ids(self, data):
        """The ids of the packets in a batch read from the socket."""
        for msg_type, _, payload in self._messages(data):
            if msg_type != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                continue
            offset = NFGENMSG.size
            while offset + NLATTR.size <= len(payload):
                length, attr_type = NLATTR.unpack_from(payload, offset)
                if length < NLATTR.size:
                    break
                if attr_type & 0x3fff == NFQA_PACKET_HDR:
                    yield struct.unpack_from("!I", payload, offset + NLATTR.size)[0]
                    break
                offset += (length + 3) & ~3

    def verdict(self, packet_id, verdict):
        self._send(NFQNL_MSG_VERDICT, [(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay", type=float, required=True, help="ms")
    parser.add_argument("--jitter", type=float, default=0, help="ms")
    parser.add_argument("--loss", type=float, default=0, help="percent")
    args = parser.parse_args()
    if args.delay < 0 or args.jitter < 0 or not 0 <= args.loss < 100:
        sys.exit("delayer: delay and jitter >= 0 ms, loss in [0, 100) %")
    queue = Queue(args.queue)
    queue.bind()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print("ready", flush=True)
    held = []  # (due, order, packet id)
    order = itertools.count()
    while not stopping:
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue.verdict(heapq.heappop(held)[2], NF_ACCEPT)
        timeout = max(0.0, held[0][0] - now) if held else 0.5
        try:
            ready, _, _ = select.select([queue.sock], [], [], timeout)
        except InterruptedError:
            continue
        if not ready:
            continue
        data = queue.sock.recv(1 << 20)
        now = time.monotonic()
        for packet_id in queue.packet_ids(data):
            if args.loss > 0 and random.random() * 100 < args.loss:
                queue.verdict(packet_id, NF_DROP)
                continue
            delay = args.delay + random.uniform(-args.jitter, args.jitter)
            heapq.heappush(held, (now + max(0.0, delay) / 1000, next(order), packet_id))
    for _, _, packet_id in held:
        queue.verdict(packet_id, NF_ACCEPT)


if __name__ == "__main__":
    main()
