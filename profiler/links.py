"""Every link: latency and bandwidth of every ordered rank pair.

Pairs are measured in rounds of disjoint pairs (profiler.rounds), all pairs of a round at once,
first the lower rank sending, then the higher. Each measurement is a ping-pong: the sender sends
``n`` bytes, the receiver answers with one element, so time(n) = 2 latency + n / bandwidth. The
small size gives the latency (half the round trip), the large one the bandwidth:
(large - small) / (time(large) - time(small)). Where that difference is lost in the noise (less
than half of time(large), as with a latency of milliseconds on oversubscribed cores), the
bandwidth is taken as large / time(large), a lower bound, rather than a figure noise inflated.
"""

import time
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from profiler.context import Context
from profiler.rounds import round_robin
from profiler.stats import Timing


@dataclass(frozen=True, slots=True)
class LinkSample:
    """One direction of one pair, as the sender measured it."""

    src: int
    dst: int
    small: Timing
    large: Timing


def _ping_pong(ctx: Context, peer: int, payload: torch.Tensor, ack: torch.Tensor, *, sending: bool) -> None:
    delay = _injected_delay(ctx, peer) * payload.numel() * payload.element_size() / ctx.settings.bandwidth_bytes
    if sending:
        dist.send(payload, peer)
        dist.recv(ack, peer)
    else:
        dist.recv(payload, peer)
        if delay:
            time.sleep(delay)
        dist.send(ack, peer)


def _injected_delay(ctx: Context, peer: int) -> float:
    """Testing aid: seconds added to a bandwidth-size transfer on the chosen pairs (pro rata for
    smaller ones), which makes that link slower by both latency and bandwidth."""
    return sum(seconds for a, b, seconds in ctx.settings.inject_link_delay if {ctx.rank, peer} == {a, b})


def measure(ctx: Context) -> list[list[LinkSample]] | None:
    """Every rank's samples (the directions it sent), on rank 0."""
    elem = 4  # float32
    small = torch.zeros(max(1, ctx.settings.latency_bytes // elem), device=ctx.device)
    large = torch.zeros(max(1, ctx.settings.bandwidth_bytes // elem), device=ctx.device)
    ack = torch.zeros(1, device=ctx.device)
    samples: list[LinkSample] = []
    rounds = round_robin(ctx.world_size)
    ctx.expect("links", 2 * len(rounds))
    for index, pairs in enumerate(rounds):
        partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}
        for direction in ("up", "down"):
            ctx.at("links", f"round {index + 1}/{len(rounds)} {direction}")
            peer = partner.get(ctx.rank)
            sending = peer is not None and ((ctx.rank < peer) == (direction == "up"))
            timings = []
            for payload in (small, large):
                if peer is None:
                    # Sit the round out but keep step with the others' barriers.
                    ctx.time(lambda: None)
                    continue
                timings.append(ctx.time(partial(_ping_pong, ctx, peer, payload, ack, sending=sending)))
            if peer is not None and sending:
                samples.append(LinkSample(ctx.rank, peer, timings[0], timings[1]))
    return ctx.gather(samples)


def link_figures(sample: LinkSample, small_bytes: int, large_bytes: int) -> tuple[float, float, float]:
    """(bandwidth bytes/s, latency s, bandwidth spread) of one measured direction."""
    latency = sample.small.median_s / 2
    extra_s = sample.large.median_s - sample.small.median_s
    if extra_s >= sample.large.median_s / 2:
        bandwidth = (large_bytes - small_bytes) / extra_s
    else:
        bandwidth = large_bytes / sample.large.median_s
    return bandwidth, latency, sample.large.spread
