"""A link matrix's arrays (``LinkMatrix.arrays``) agree with ``LinkMatrix.link`` on every pair in
each of its three forms, are built once and read-only, and a changed copy builds its own; rings
read through them price as rings read link by link."""

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.schemas import LinkMatrix
from planner.schemas.errors import SchemaError
from planner.schemas.links import LinkProfile

# Few distinct values, so that ties (equal bandwidths, equal latencies) are common.
BANDWIDTHS = st.sampled_from([1e9, 5e9, 12.5e9, 25e9])
LATENCIES = st.sampled_from([0.0, 2e-6, 5e-6])
LINKS = st.builds(LinkProfile, bandwidth_bytes_per_s=BANDWIDTHS, latency_s=LATENCIES)


@st.composite
def matrices(draw: st.DrawFn) -> LinkMatrix:
    """A matrix of 1-6 endpoints in one of the three forms; explicit ones with no self-link (0 on
    the diagonal), as profiles store them."""
    n = draw(st.integers(1, 6))
    form = draw(st.sampled_from(["uniform", "endpoints", "explicit"]))
    if form == "uniform":
        return LinkMatrix(size=n, uniform=draw(LINKS))
    if form == "endpoints":
        return LinkMatrix(size=n, endpoints=tuple(draw(LINKS) for _ in range(n)))
    bandwidth = tuple(tuple(0.0 if i == j else draw(BANDWIDTHS) for j in range(n)) for i in range(n))
    latency = tuple(tuple(draw(LATENCIES) for _ in range(n)) for _ in range(n))
    return LinkMatrix(size=n, bandwidth_bytes_per_s=bandwidth, latency_s=latency)


def _no_self_link(links: LinkMatrix, i: int, j: int) -> bool:
    return i == j and links.bandwidth_bytes_per_s is not None


@given(links=matrices())
def test_arrays_agree_with_link_on_every_pair(links: LinkMatrix) -> None:
    arrays = links.arrays()
    assert arrays.bandwidth_bytes_per_s.shape == arrays.latency_s.shape == (links.size, links.size)
    for i in range(links.size):
        for j in range(links.size):
            if _no_self_link(links, i, j):
                assert arrays.bandwidth_bytes_per_s[i, j] == 0.0  # what is stored; link() refuses it
                continue
            link = links.link(i, j)
            assert arrays.bandwidth_bytes_per_s[i, j] == link.bandwidth_bytes_per_s
            assert arrays.latency_s[i, j] == link.latency_s


@given(links=matrices(), data=st.data())
def test_a_ring_read_through_the_arrays_prices_as_its_links_one_by_one(links: LinkMatrix, data: st.DataObject) -> None:
    if links.size < 2:
        return
    ring = data.draw(st.permutations(range(links.size)).map(lambda p: tuple(p[: max(2, len(p) - 1)])))
    pairs = [links.link(a, b) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)]
    slowest = links.ring_slowest(ring)
    assert slowest.bandwidth_bytes_per_s == min(lk.bandwidth_bytes_per_s for lk in pairs)
    assert slowest.latency_s == max(lk.latency_s for lk in pairs)


@given(seed=st.integers(0, 2**16), length=st.sampled_from([2, 8, 16, 17, 40]))
def test_a_long_ring_and_a_short_one_read_the_same_way(seed: int, length: int) -> None:
    """Rings of up to ``SMALL_RING`` endpoints are read entry by entry, longer ones through the
    arrays: either prices as the links one by one."""
    rng = np.random.default_rng(seed)
    n = 40
    bandwidth = rng.choice([1e9, 5e9, 12.5e9, 25e9], size=(n, n))
    np.fill_diagonal(bandwidth, 0.0)
    latency = rng.choice([0.0, 2e-6, 5e-6], size=(n, n))
    links = LinkMatrix(
        size=n,
        bandwidth_bytes_per_s=tuple(map(tuple, bandwidth.tolist())),
        latency_s=tuple(map(tuple, latency.tolist())),
    )
    ring = tuple(int(e) for e in rng.permutation(n)[:length])
    pairs = [links.link(a, b) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)]
    slowest = links.ring_slowest(ring)
    assert slowest == LinkProfile(
        bandwidth_bytes_per_s=min(lk.bandwidth_bytes_per_s for lk in pairs), latency_s=max(lk.latency_s for lk in pairs)
    )
    assert links.ring_slowest(range(length)) == links.ring_slowest(tuple(range(length)))


def test_endpoints_pair_the_slower_ends_hand_worked() -> None:
    # Endpoint 0: 10 GB/s, 3 us; 1: 20 GB/s, 1 us; 2: 30 GB/s, 2 us.
    ends = tuple(LinkProfile(bandwidth_bytes_per_s=b * 1e9, latency_s=t * 1e-6) for b, t in ((10, 3), (20, 1), (30, 2)))
    arrays = LinkMatrix(size=3, endpoints=ends).arrays()
    assert arrays.bandwidth_bytes_per_s.tolist() == [[10e9, 10e9, 10e9], [10e9, 20e9, 20e9], [10e9, 20e9, 30e9]]
    assert arrays.latency_s.tolist() == [[3e-6, 3e-6, 3e-6], [3e-6, 1e-6, 2e-6], [3e-6, 2e-6, 2e-6]]


def test_arrays_are_built_once_read_only_and_a_changed_copy_builds_its_own() -> None:
    links = LinkMatrix(size=2, bandwidth_bytes_per_s=((0.0, 1e9), (2e9, 0.0)), latency_s=((0.0, 1e-6), (1e-6, 0.0)))
    arrays = links.arrays()
    assert links.arrays() is arrays
    with pytest.raises(ValueError):
        arrays.bandwidth_bytes_per_s[0, 1] = 5e9
    changed = links.model_copy(update={"bandwidth_bytes_per_s": ((0.0, 3e9), (4e9, 0.0))})
    assert changed.arrays().bandwidth_bytes_per_s[0, 1] == 3e9 == changed.link(0, 1).bandwidth_bytes_per_s
    for twin in (pickle.loads(pickle.dumps(links)), copy.deepcopy(links), copy.copy(links)):
        assert twin == links
        assert np.array_equal(twin.arrays().bandwidth_bytes_per_s, arrays.bandwidth_bytes_per_s)
    assert "_arrays" not in links.model_dump()


def test_a_zero_bandwidth_off_the_diagonal_is_refused_naming_the_pair() -> None:
    with pytest.raises(SchemaError, match=r"link 1->0 has bandwidth 0\.0; it must be > 0"):
        LinkMatrix(size=2, bandwidth_bytes_per_s=((0.0, 1e9), (0.0, 0.0)), latency_s=((0.0, 0.0), (0.0, 0.0)))


def test_duplex_figures_are_checked_and_bound_only_a_two_member_ring() -> None:
    one_way = ((0.0, 1e9, 1e9), (1e9, 0.0, 1e9), (1e9, 1e9, 0.0))
    latency = ((0.0,) * 3,) * 3
    duplex = ((0.0, 0.8e9, 1e9), (0.8e9, 0.0, 1e9), (1e9, 1e9, 0.0))
    links = LinkMatrix(size=3, bandwidth_bytes_per_s=one_way, latency_s=latency, duplex_bandwidth_bytes_per_s=duplex)
    assert links.ring_slowest((1, 0)).bandwidth_bytes_per_s == 0.8e9
    assert links.ring_slowest((1, 2)).bandwidth_bytes_per_s == 1e9
    assert links.ring_slowest((0, 1, 2)).bandwidth_bytes_per_s == 1e9  # one way over each link
    with pytest.raises(SchemaError, match=r"link 0<->2 has duplex bandwidth 0\.0; it must be > 0"):
        bad = ((0.0, 0.8e9, 0.0), (0.8e9, 0.0, 1e9), (1e9, 1e9, 0.0))
        LinkMatrix(size=3, bandwidth_bytes_per_s=one_way, latency_s=latency, duplex_bandwidth_bytes_per_s=bad)
    with pytest.raises(SchemaError, match="duplex_bandwidth_bytes_per_s must be 3 x 3"):
        LinkMatrix(size=3, bandwidth_bytes_per_s=one_way, latency_s=latency, duplex_bandwidth_bytes_per_s=((1.0,),))
    with pytest.raises(SchemaError, match="goes with explicit"):
        LinkMatrix(
            size=2, uniform=LinkProfile(bandwidth_bytes_per_s=1e9, latency_s=0.0), duplex_bandwidth_bytes_per_s=()
        )
