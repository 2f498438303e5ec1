"""Context parallelism's cost: the ring's bytes and exposed time worked by hand, every
rank's share of the work and memory, the validity rules, and the search choosing it where
sequences are long."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import groups as grp
from cost_models.compute import fused_attention_s, gemms_time_s
from cost_models.context_parallel import (
    AttentionCall,
    all_to_all_buffer_bytes,
    all_to_all_bytes_per_layer,
    all_to_all_elements,
    all_to_all_layer_s,
    attention_calls,
    context_buffer_bytes,
    context_bytes_sent_per_step,
    context_parallel_layer_s,
    kv_block_bytes,
    kv_heads_exchanged,
    kv_replication,
    ring_buffer_bytes,
    ring_bytes_per_layer,
    ring_exposed_s,
    ring_hop_s,
    slowest_links,
)
from cost_models.estimate import estimate
from cost_models.layer_time import _layer_time
from cost_models.layer_work import layer_work
from cost_models.memory import stage_memory
from cost_models.overlap import OVERLAP_COMPUTE_SLOWDOWN
from planner import api
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import (
    AttentionKernel,
    ContextParallelKind,
    Layout,
    LinkProfile,
    Recompute,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.settings import SearchSettings

LLAMA = load_model("llama3-8b")  # 32 layers, 8 kv heads of 128
NODE = load_cluster("dgx-h100:1")  # NVLink: 370e9 B/s, 2.8 us
TINY = load_model("tiny-gpt")
SIGMA = OVERLAP_COMPUTE_SLOWDOWN / (1 + OVERLAP_COMPUTE_SLOWDOWN)


def _layout(dp: int, cp: int, tp: int = 1, **more: object) -> Layout:
    return Layout(
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        context_parallel_degree=cp,
        **more,  # type: ignore[arg-type]
    )


TRAINING = TrainingSpec(global_batch_size=16, seq_len=8192)
BLOCK = 4096 * 2 * 8 * 128  # b (s/cp) (k + v) elements of one rank at cp 2: 8,388,608


def test_ring_bytes_per_step_by_hand() -> None:
    layout = _layout(dp=4, cp=2)
    assert kv_block_bytes(LLAMA, TRAINING, layout) == 2 * BLOCK == 16_777_216  # bf16
    per_layer = ring_bytes_per_layer(LLAMA, TRAINING, layout)
    assert per_layer.forward_bytes == 16_777_216  # cp - 1 = 1 k/v block
    assert per_layer.backward_bytes == 16_777_216 + BLOCK * 4  # cp - 1 = 1 k/v block and 1 fp32 dk/dv block
    step = context_bytes_sent_per_step(LLAMA, TRAINING, layout)
    micro_batches = 16 // 4  # B / (d b): the cp ranks share the same sequences
    assert step.forward_bytes == 32 * micro_batches * 16_777_216 == 2_147_483_648
    assert step.backward_bytes == 32 * micro_batches * 50_331_648 == 6_442_450_944
    for recompute in (Recompute.FULL, Recompute.SELECTIVE):  # both recompute the attention core, ring included
        again = context_bytes_sent_per_step(LLAMA, TRAINING, dataclasses.replace(layout, recompute=recompute))
        assert again.forward_bytes == 2 * step.forward_bytes and again.backward_bytes == step.backward_bytes
    # cp 4 under tp 2: a block is b (s/4) (k + v) / t, sent 3 times forward, 3 + 3 (fp32) backward.
    four = ring_bytes_per_layer(LLAMA, TRAINING, _layout(dp=1, cp=4, tp=2))
    block = 2048 * 2 * 8 * 128 // 2
    assert (four.forward_bytes, four.backward_bytes) == (3 * 2 * block, 3 * 2 * block + 3 * 4 * block)
    assert ring_bytes_per_layer(LLAMA, TRAINING, _layout(dp=8, cp=1)).total_bytes == 0


@settings(max_examples=60, deadline=None)
@given(
    links=st.lists(
        st.builds(
            LinkProfile,
            bandwidth_bytes_per_s=st.sampled_from([25e9, 50e9, 100e9, 300e9, 450e9]),
            latency_s=st.sampled_from([0.0, 2e-6, 5e-6, 8e-6]),
        ),
        min_size=1,
        max_size=12,
    ),
    message_bytes=st.sampled_from([0.0, 1.0, 4096.0, 2.0**20, 2.0**30]),
)
def test_the_slowest_links_hold_the_slowest_send(links: list[LinkProfile], message_bytes: float) -> None:
    """Pricing a ring step over the front of the slowest links is pricing it over them all, for
    any message: the links dropped are each no slower than a kept one on both counts."""
    front = slowest_links(links)
    assert set(front) <= set(links)
    assert ring_hop_s(message_bytes, front) == ring_hop_s(message_bytes, links)
    for kept in front:
        slower = (
            other
            for other in links
            if other.bandwidth_bytes_per_s <= kept.bandwidth_bytes_per_s and other.latency_s >= kept.latency_s
        )
        assert all(other == kept for other in slower)


def test_a_ring_step_exposes_what_its_block_compute_does_not_hold() -> None:
    assert ring_exposed_s([3.0, 1.0], 2.0, slowdown=0.0) == 1.0  # max(0, 3 - 2) + max(0, 1 - 2)
    assert ring_exposed_s([3.0, 1.0], 2.0, hides=False) == 4.0  # gloo on CPU: all of it
    assert ring_exposed_s([3.0], 2.0) == pytest.approx(max(1.0, 3.0 * SIGMA))


def test_two_ranks_over_nvlink_by_hand() -> None:
    layout = _layout(dp=4, cp=2)  # 8 ranks: context groups (0, 1), (2, 3), ... inside the node
    latency, bandwidth = 2.8e-6, 370e9
    kv_s = latency + 2 * BLOCK / bandwidth  # the k/v block, bf16
    dkv_s = latency + 4 * BLOCK / bandwidth  # the dk/dv accumulator's one hop home, behind no compute

    def layer_s(attention: tuple[float, float]) -> float:
        return context_parallel_layer_s(LLAMA, TRAINING, NODE, layout, grp.context_groups(layout), attention)

    # cp 2: the k/v block goes out once forward and once backward, each behind a block's compute
    assert layer_s((0.0, 0.0)) == pytest.approx(2 * kv_s + dkv_s)  # nothing to hide behind
    hidden = SIGMA * 2 * kv_s + dkv_s  # blocks long enough: what overlapping costs
    assert layer_s((1.0, 1.0)) == pytest.approx(hidden)
    # A forward block of 50 us holds the 48 us send; a backward block of 20 us leaves 28 us of it exposed.
    assert 2e-5 < kv_s < 5e-5 and kv_s - 2e-5 > SIGMA * kv_s
    assert layer_s((2 * 5e-5, 2 * 2e-5)) == pytest.approx(SIGMA * kv_s + (kv_s - 2e-5) + dkv_s)


def test_each_rank_does_its_share_of_the_work() -> None:
    one, two = (layer_work(LLAMA, TRAINING, _layout(dp=8 // c, cp=c)) for c in (1, 2))
    assert [g.m for g in two.dense_gemms] == [4096, 4096, 4096, 4096]  # b s / cp tokens
    assert sum(g.flop for g in two.dense_gemms) == sum(g.flop for g in one.dense_gemms) / 2
    # Attention: s/cp queries against all s keys, half the whole (the zig-zag balances its causal half).
    assert (two.attention_gemms[0].m, two.attention_gemms[0].n) == (4096, 8192)
    assert sum(g.flop for g in two.attention_gemms) == sum(g.flop for g in one.attention_gemms) / 2


def test_the_kernel_calls_each_kind_of_rank_makes() -> None:
    # s = 8192. Ring at cp 4: step 0 the rank's 2048 tokens causal; the 3 others (2048 x 1024
    # blocks, all visible) unmasked, at the rate of a square of the same work, 8192 / (4 sqrt 2).
    assert attention_calls(TRAINING, _layout(dp=2, cp=4)) == (
        AttentionCall(share=0.25, seq_len=2048, causal=True),
        AttentionCall(share=0.75, seq_len=1448, causal=False),
    )
    # Without context parallelism, and the all-to-all (all 8192 queries of 1/cp of the heads): causal.
    whole = (AttentionCall(share=1.0, seq_len=8192, causal=True),)
    assert attention_calls(TRAINING, _layout(dp=8, cp=1)) == whole
    assert attention_calls(TRAINING, _layout(dp=2, cp=4, context_parallel_kind=ContextParallelKind.ALL_TO_ALL)) == whole


def test_the_ring_prices_its_steps_at_their_own_mask_and_length() -> None:
    # cp 2, s = 8192: the diagonal step (half the rank's attention FLOPs) causal at 4096, the other
    # unmasked at 8192 / (2 sqrt 2) = 2896, where dgx-h100's records hold the FA3 paper's
    # unmasked FlashAttention-2 figures; the layer adds those over the GEMMs' pricing without records.
    layout = _layout(dp=4, cp=2)
    work = layer_work(LLAMA, TRAINING, layout)
    flop = 0.5 * sum(g.flop for g in work.attention_gemms)
    device, dt = NODE.pricing_device, TRAINING.dtype
    diagonal = fused_attention_s(flop / 2, 4096, 128, device, dt) or (0.0, 0.0)
    off = fused_attention_s(flop / 2, 2896, 128, device, dt, causal=False) or (0.0, 0.0)
    assert off[0] < diagonal[0] and off[1] < diagonal[1]  # unmasked blocks run at the higher rate
    bare = NODE.model_copy(update={"device": device.model_copy(update={"op_records": ()})})
    priced, unpriced = (_layer_time(LLAMA, TRAINING, c, layout, None, moe=False) for c in (NODE, bare))
    as_gemms = 0.5 * gemms_time_s(work.attention_gemms, device, dt)
    assert priced.forward_s - unpriced.forward_s == pytest.approx(diagonal[0] + off[0] - as_gemms)
    assert priced.backward_s - unpriced.backward_s == pytest.approx(diagonal[1] + off[1] - 2.5 * as_gemms)


def test_cp_one_is_the_layout_without_it() -> None:
    plain = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    assert estimate(LLAMA, TRAINING, NODE, plain) == estimate(LLAMA, TRAINING, NODE, _layout(dp=8, cp=1))
    assert estimate(LLAMA, TRAINING, NODE, plain).time.context_parallel_comm_s == 0.0


def test_context_parallel_time_is_a_term_of_the_step() -> None:
    est = estimate(LLAMA, TRAINING, NODE, _layout(dp=4, cp=2, zero_stage=ZeroStage.OPTIMIZER))
    assert est.time.context_parallel_comm_s > 0
    terms = [getattr(est.time, f.name) for f in dataclasses.fields(est.time)]
    assert est.step_time_s == pytest.approx(sum(terms) - est.time.data_parallel_comm_overlapped_s)


@pytest.mark.parametrize(
    ("seq_len", "kernel", "fragment"),
    [
        (8190, AttentionKernel.FLASH, "2 x cp = 4 equal chunks, but seq_len=8190"),
        (8192, AttentionKernel.EAGER, "use attention_kernel flash or cudnn, the all-to-all kind"),
    ],
)
def test_what_context_parallelism_needs(seq_len: int, kernel: AttentionKernel, fragment: str) -> None:
    training = TrainingSpec(global_batch_size=16, seq_len=seq_len, attention_kernel=kernel)
    with pytest.raises(InfeasibleConfigError, match="context") as refused:
        estimate(LLAMA, training, NODE, _layout(dp=4, cp=2))
    assert fragment in str(refused.value)


def test_the_world_counts_the_context_ranks() -> None:
    with pytest.raises(InfeasibleConfigError, match=r"dp x cp x tp x pp = 8 x 2 x 1 x 1 = 16 ranks"):
        estimate(LLAMA, TRAINING, NODE, _layout(dp=8, cp=2))


@given(
    cp=st.sampled_from([2, 4, 8]),
    tp=st.sampled_from([1, 2, 4]),
    micro_batch=st.sampled_from([1, 2]),
    recompute=st.sampled_from(list(Recompute)),
    kernel=st.sampled_from(list(AttentionKernel)),
    seq_len=st.sampled_from([1024, 4096]),
)
@settings(max_examples=40, deadline=None)
def test_context_parallelism_never_adds_activation_memory(
    cp: int, tp: int, micro_batch: int, recompute: Recompute, kernel: AttentionKernel, seq_len: int
) -> None:
    training = TrainingSpec(global_batch_size=16, seq_len=seq_len, attention_kernel=kernel)
    base = Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=1,
        micro_batch_size=micro_batch,
        recompute=recompute,
        sequence_parallel=tp > 1,
    )
    split = dataclasses.replace(base, context_parallel_degree=cp)
    alone, shared = (stage_memory(TINY, training, NODE, layout, 0) for layout in (base, split))
    assert shared.activations_bytes + shared.logits_bytes <= alone.activations_bytes + alone.logits_bytes
    assert ring_buffer_bytes(TINY, training, split) > 0 == ring_buffer_bytes(TINY, training, base)


def test_the_search_splits_long_sequences_and_the_plan_fits() -> None:
    # llama3-8b at 128k tokens on 64 H100s: a sequence's activations do not fit one rank.
    plan = api.search(
        "llama3-8b", "dgx-h100:8", TrainingSpec(global_batch_size=64, seq_len=131072), SearchSettings(top_k=1)
    )[0]
    assert plan.layout.context_parallel_degree > 1
    assert plan.estimate.peak_memory_bytes <= plan.estimate.memory_capacity_bytes
    assert plan.estimate.time.context_parallel_comm_s > 0


# --- the all-to-all kind (DeepSpeed-Ulysses) -------------------------------------------------------

A2A = ContextParallelKind.ALL_TO_ALL
# One rank's buffers at cp 2 (4096 tokens), bf16: q and the output 32 heads of 128, k and v 8.
Q_BYTES, KV_BYTES = 4096 * 32 * 128 * 2, 4096 * 8 * 128 * 2  # 33,554,432 and 8,388,608


def test_all_to_all_bytes_per_step_by_hand() -> None:
    layout = _layout(dp=4, cp=2, context_parallel_kind=A2A)
    assert layout.describe() == "dp4 tp1 pp1 cp2a2a mb1 zero0 rc-none"
    buffers = all_to_all_elements(LLAMA, TRAINING, layout)
    assert (buffers.query, buffers.key, buffers.value, buffers.output) == (
        Q_BYTES // 2,
        KV_BYTES // 2,
        KV_BYTES // 2,
        Q_BYTES // 2,
    )
    # Each all-to-all keeps half of the buffer and sends half: (33.5 + 8.4 + 8.4 + 33.5) MB / 2 = 41.9 MB.
    per_layer = all_to_all_bytes_per_layer(LLAMA, TRAINING, layout)
    assert per_layer.forward_bytes == per_layer.backward_bytes == 41_943_040
    step = context_bytes_sent_per_step(LLAMA, TRAINING, layout)
    assert step.forward_bytes == step.backward_bytes == 32 * 4 * 41_943_040 == 5_368_709_120
    ring = dataclasses.replace(layout, context_parallel_kind=ContextParallelKind.RING)
    assert (
        context_bytes_sent_per_step(LLAMA, TRAINING, ring).forward_bytes
        == 32 * 4 * ring_bytes_per_layer(LLAMA, TRAINING, ring).forward_bytes
    )  # the kind decides which exchange is counted
    # Full recompute runs the 4 again; selective the attention core's q, k and v (its output's is not needed).
    full = context_bytes_sent_per_step(LLAMA, TRAINING, dataclasses.replace(layout, recompute=Recompute.FULL))
    assert (full.forward_bytes, full.backward_bytes) == (2 * step.forward_bytes, step.backward_bytes)
    selective = all_to_all_bytes_per_layer(LLAMA, TRAINING, dataclasses.replace(layout, recompute=Recompute.SELECTIVE))
    assert selective.forward_bytes == 41_943_040 + (Q_BYTES + 2 * KV_BYTES) // 2 == 67_108_864
    # cp 8 under tp 1: buffers of 1024 tokens, 7/8 of them sent; the total falls as 1/cp (the ring's does not).
    eight = all_to_all_bytes_per_layer(LLAMA, TRAINING, _layout(dp=1, cp=8, context_parallel_kind=A2A))
    assert eight.forward_bytes == 1024 * (32 + 8 + 8 + 32) * 128 * 2 * 7 // 8 == 18_350_080
    assert all_to_all_bytes_per_layer(LLAMA, TRAINING, _layout(dp=8, cp=1, context_parallel_kind=A2A)).total_bytes == 0


def test_kv_heads_are_repeated_up_to_a_multiple_of_cp() -> None:
    # tp 4 leaves a rank 8 query heads and 2 kv heads; cp 4 hands each rank 2 query heads and one
    # kv head: each of the 2 repeated twice, lcm(2, 4) = 4 heads handed out.
    layout = _layout(dp=1, cp=4, tp=4, context_parallel_kind=A2A)
    assert (kv_heads_exchanged(LLAMA, layout), kv_replication(LLAMA, layout)) == (4, 2)
    buffers = all_to_all_elements(LLAMA, TRAINING, layout)
    assert (buffers.query, buffers.key) == (2048 * 8 * 128, 2048 * 4 * 128)
    assert all_to_all_bytes_per_layer(LLAMA, TRAINING, layout).forward_bytes == 2048 * 24 * 128 * 2 * 3 // 4
    # cp 2 divides the 2 kv heads: none repeated; the ring never repeats them.
    assert kv_replication(LLAMA, _layout(dp=2, cp=2, tp=4, context_parallel_kind=A2A)) == 1
    assert kv_replication(LLAMA, _layout(dp=1, cp=4, tp=4)) == 1
    # The attention core keeps the repeated k and v: 2 x (k + v) of 2048 tokens, 2 heads, bf16 more.
    ring_like = dataclasses.replace(layout, context_parallel_kind=ContextParallelKind.RING)
    kept = [
        stage_memory(LLAMA, TRAINING, NODE, x, 0).activations_bytes
        - (all_to_all_buffer_bytes if x is layout else ring_buffer_bytes)(LLAMA, TRAINING, x)
        for x in (layout, ring_like)
    ]
    assert kept[0] - kept[1] == 32 * 2048 * 2 * 128 * 2 * 2  # 32 layers, k and v, (4 - 2) heads, bf16


def test_all_to_alls_run_in_line_over_the_links_by_hand() -> None:
    bare = NODE.model_copy(update={"collectives": ()})  # no records: (n - 1) latencies + (n - 1)/n bytes / bandwidth
    layout = _layout(dp=4, cp=2, context_parallel_kind=A2A)
    groups = list(grp.context_groups(layout))
    once = sum(2.8e-6 + b / 2 / 370e9 for b in (Q_BYTES, KV_BYTES, KV_BYTES, Q_BYTES))  # 124.6 us
    assert all_to_all_layer_s(LLAMA, TRAINING, bare, layout, groups) == pytest.approx(2 * once)
    # Nothing hides them: the attention's time does not change the layer's.
    assert context_parallel_layer_s(LLAMA, TRAINING, bare, layout, groups, (1.0, 1.0)) == pytest.approx(2 * once)
    full = dataclasses.replace(layout, recompute=Recompute.FULL)
    assert all_to_all_layer_s(LLAMA, TRAINING, bare, full, groups) == pytest.approx(3 * once)
    selective = dataclasses.replace(layout, recompute=Recompute.SELECTIVE)
    out_s = 2.8e-6 + Q_BYTES / 2 / 370e9
    assert all_to_all_layer_s(LLAMA, TRAINING, bare, selective, groups) == pytest.approx(3 * once - out_s)
    # 16 ranks over two nodes: half of each buffer crosses the 48 GB/s rail, 7/16 stays on NVLink.
    two_nodes = load_cluster("dgx-h100:2")
    wide = _layout(dp=1, cp=16, context_parallel_kind=A2A)
    tokens = 8192 // 16
    buffers = [tokens * w * 128 * 2 for w in (32, 16, 16, 32)]  # kv: lcm(8, 16) = 16 heads
    wide_once = sum(2.7e-6 + max(b / 2 / 48e9, 7 / 16 * b / 370e9) for b in buffers)
    assert all_to_all_layer_s(LLAMA, TRAINING, two_nodes, wide, list(grp.context_groups(wide))) == pytest.approx(
        2 * wide_once
    )
    est = estimate(LLAMA, TRAINING, bare, dataclasses.replace(layout, zero_stage=ZeroStage.OPTIMIZER))
    micro_batches = 4
    assert est.time.context_parallel_comm_s == pytest.approx(32 * micro_batches * 2 * once)


def test_all_to_all_buffers_by_hand() -> None:
    layout = _layout(dp=4, cp=2, context_parallel_kind=A2A)
    assert all_to_all_buffer_bytes(LLAMA, TRAINING, layout) == 2 * Q_BYTES + 2 * KV_BYTES
    assert context_buffer_bytes(LLAMA, TRAINING, layout) == 2 * Q_BYTES + 2 * KV_BYTES
    ring = dataclasses.replace(layout, context_parallel_kind=ContextParallelKind.RING)
    assert context_buffer_bytes(LLAMA, TRAINING, ring) == ring_buffer_bytes(LLAMA, TRAINING, ring)


@pytest.mark.parametrize(
    ("cp", "tp", "seq_len", "fragment"),
    [
        (
            8,
            8,
            8192,
            "gives each rank 1/cp of a tensor-parallel rank's 4 query heads, but cp does not divide 4; "
            "use a cp among 2, 4 or the ring",
        ),
        (2, 1, 8191, "splits every sequence into 2 equal chunks, but seq_len=8191 is not divisible by 2"),
    ],
)
def test_what_the_all_to_all_needs(cp: int, tp: int, seq_len: int, fragment: str) -> None:
    cluster = load_cluster("dgx-h100:8")
    training = TrainingSpec(global_batch_size=64, seq_len=seq_len)
    with pytest.raises(InfeasibleConfigError) as refused:
        estimate(LLAMA, training, cluster, _layout(dp=64 // (cp * tp), cp=cp, tp=tp, context_parallel_kind=A2A))
    assert fragment in str(refused.value)


def test_the_all_to_all_runs_any_attention_kernel_and_a_sequence_the_ring_cannot_split() -> None:
    eager = TrainingSpec(global_batch_size=16, seq_len=8192, attention_kernel=AttentionKernel.EAGER)
    assert estimate(LLAMA, eager, NODE, _layout(dp=4, cp=2, context_parallel_kind=A2A)).step_time_s > 0
    odd = TrainingSpec(global_batch_size=16, seq_len=8190)  # 8190 % 4: no zig-zag split
    assert estimate(LLAMA, odd, NODE, _layout(dp=4, cp=2, context_parallel_kind=A2A)).step_time_s > 0


def test_the_kind_is_stored_as_ring_without_context_parallelism() -> None:
    assert _layout(dp=8, cp=1, context_parallel_kind="all-to-all") == _layout(dp=8, cp=1)
    assert _layout(dp=4, cp=2, context_parallel_kind="all-to-all").context_parallel_kind is A2A
    with pytest.raises(SchemaError, match="context_parallel_kind='ulysses' is not one of 'ring', 'all-to-all'"):
        _layout(dp=4, cp=2, context_parallel_kind="ulysses")


def test_each_kind_keeps_its_own_kernel_time_whichever_is_priced_first() -> None:
    # The ring's off-diagonal blocks run unmasked, the all-to-all's attention causal over the
    # whole sequence: their compute differs, and a memo shared by the two would hide it.
    ring, a2a = _layout(dp=4, cp=2), _layout(dp=4, cp=2, context_parallel_kind=ContextParallelKind.ALL_TO_ALL)
    first = [estimate(LLAMA, TRAINING, NODE, x).time.compute_s for x in (ring, a2a)]
    second = [estimate(LLAMA, TRAINING, NODE, x).time.compute_s for x in (a2a, ring)][::-1]
    assert first == second and first[0] != first[1]
