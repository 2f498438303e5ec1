"""Every link: latency and bandwidth of every ordered rank pair, and each pair's duplex bandwidth.

Pairs are measured in rounds of disjoint pairs (profiler.rounds), all pairs of a round at once,
first the lower rank sending, then the higher, then both at once. Each one-way measurement is a
ping-pong: the sender sends ``n`` bytes, the receiver answers with one element, so time(n) =
2 latency + n / bandwidth. The small size gives the latency (half the round trip), the large one
the bandwidth: (large - small) / (time(large) - time(small)). Where that difference is lost in
the noise (less than half of time(large), as with a latency of milliseconds on oversubscribed
cores), the bandwidth is taken as large / time(large), a lower bound, rather than a figure noise
inflated.

The exchange sends ``n`` bytes each way at once (a two-member ring's all-reduce does): time =
latency + n / duplex bandwidth, each direction's share of the link while the other is busy too.
On the namespaced test hosts a pair's exchange gets half its one-way figure
(``benchmarks/netns_profile.py``); a full-duplex link gets its one-way figure.
"""

import time
from dataclasses import dataclass, replace
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
    exchange: Timing | None = None
    """Both ends sending the large size to each other at once, as this sender timed it (None:
    not measured, as in profiles before the exchange was)."""


def _ping_pong(ctx: Context, peer: int, payload: torch.Tensor, ack: torch.Tensor, *, sending: bool) -> None:
    delay = _injected_delay_s(ctx, peer, payload)
    if sending:
        dist.send(payload, peer)
        dist.recv(ack, peer)
    else:
        dist.recv(payload, peer)
        if delay:
            time.sleep(delay)
        dist.send(ack, peer)


def _exchange(ctx: Context, peer: int, payload: torch.Tensor, inbox: torch.Tensor) -> None:
    requests = [dist.isend(payload, peer), dist.irecv(inbox, peer)]
    for request in requests:
        assert request is not None  # None only for ranks outside the (default) group
        request.wait()
    if delay := _injected_delay_s(ctx, peer, payload):
        time.sleep(delay)


def _injected_delay_s(ctx: Context, peer: int, payload: torch.Tensor) -> float:
    """Testing aid: seconds added to a transfer of ``payload`` on the chosen pairs, the delay given
    for a bandwidth-size transfer pro rata, which makes that link slower by both latency and
    bandwidth."""
    per_bandwidth_size_s = sum(s for a, b, s in ctx.settings.inject_link_delay if {ctx.rank, peer} == {a, b})
    return per_bandwidth_size_s * payload.numel() * payload.element_size() / ctx.settings.bandwidth_bytes


def measure(ctx: Context) -> list[list[LinkSample]] | None:
    """Every rank's samples (the directions it sent), on rank 0."""
    elem = 4  # float32
    small = torch.zeros(max(1, ctx.settings.latency_bytes // elem), device=ctx.device)
    large = torch.zeros(max(1, ctx.settings.bandwidth_bytes // elem), device=ctx.device)
    inbox = torch.zeros_like(large)
    ack = torch.zeros(1, device=ctx.device)
    samples: list[LinkSample] = []
    rounds = round_robin(ctx.world_size)
    ctx.expect("links", 3 * len(rounds))
    for index, pairs in enumerate(rounds):
        partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}
        peer = partner.get(ctx.rank)
        round_samples: list[LinkSample] = []
        for direction in ("up", "down"):
            ctx.at("links", f"round {index + 1}/{len(rounds)} {direction}")
            sending = peer is not None and ((ctx.rank < peer) == (direction == "up"))
            timings = []
            for payload in (small, large):
                if peer is None:
                    # Sit the round out but keep step with the others' barriers.
                    ctx.time(lambda: None)
                    continue
                timings.append(ctx.time(partial(_ping_pong, ctx, peer, payload, ack, sending=sending)))
            if peer is not None and sending:
                round_samples.append(LinkSample(ctx.rank, peer, timings[0], timings[1]))
        ctx.at("links", f"round {index + 1}/{len(rounds)} both ways")
        # A rank without a partner this round times nothing but keeps step with the barriers.
        exchange = ctx.time(lambda: None) if peer is None else ctx.time(partial(_exchange, ctx, peer, large, inbox))
        samples += [replace(s, exchange=exchange) for s in round_samples]
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


def duplex_bandwidth(sample: LinkSample, large_bytes: int) -> float | None:
    """Each direction's bandwidth (bytes/s) while the pair exchanged the large size, as the
    sender of ``sample`` timed it: large / (time - latency), or large / time where the latency is
    half the time or more (noise, as in ``link_figures``); None when not measured."""
    if sample.exchange is None:
        return None
    total_s, latency_s = sample.exchange.median_s, sample.small.median_s / 2
    return large_bytes / (total_s - latency_s if latency_s < total_s / 2 else total_s)
