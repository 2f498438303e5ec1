"""Run on each namespaced host (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): rank 0 times a
ping-pong of ``--bytes`` bytes with every other rank in turn (send the payload, receive a
one-element answer) and prints {peer: bytes per second} as JSON, the median of ``--repeats``.
Latency is in that figure too; at megabytes over a rate-limited link it is negligible."""

import argparse
import json
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    payload = torch.zeros(args.bytes // 4)
    ack = torch.zeros(1)
    bandwidth: dict[int, float] = {}
    for peer in range(1, world):
        if rank not in (0, peer):
            continue
        times = []
        for _ in range(args.repeats + 1):  # the first warms the connection up
            start = time.perf_counter()
            if rank == 0:
                dist.send(payload, peer)
                dist.recv(ack, peer)
            else:
                dist.recv(payload, 0)
                dist.send(ack, 0)
            times.append(time.perf_counter() - start)
        bandwidth[peer] = args.bytes / statistics.median(times[1:])
    dist.barrier()
    if rank == 0:
        print(json.dumps(bandwidth), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
