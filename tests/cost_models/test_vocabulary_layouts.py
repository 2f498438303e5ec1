"""The vocabulary layers pinned or split over the pipeline ranks (Vocabulary Parallelism):
hand-worked shares, kept bytes and waits, and what the split does to the estimate and the search."""

from dataclasses import replace

import pytest
from conftest import cpu_cluster, make_cluster
from hypothesis import given
from hypothesis import strategies as st

from cost_models import groups as grp
from cost_models.estimate import estimate
from cost_models.layer_time import shared_kernels
from cost_models.loss_memory import stage_logits_bytes
from cost_models.params import stage_params
from cost_models.stage_activations import stage_activation_bytes
from cost_models.timing import stage_times
from cost_models.vocabulary import VocabularyComm, vocabulary_activation_bytes, vocabulary_comm
from planner import api
from planner.files.models import load_model
from planner.schemas import DeviceMap, DType, Layout, PipelineBuffers, TrainingSpec, VocabularyLayout
from planner.schemas.geometry import in_flight_micro_batches
from planner.schemas.settings import SearchSettings

PINNED, VOCAB_1, VOCAB_2 = VocabularyLayout.PINNED, VocabularyLayout.VOCAB_1, VocabularyLayout.VOCAB_2
# llama3-8b's shape with 32 layers, untied 128k vocabulary
MODEL = load_model("llama3-8b")
TRAINING = TrainingSpec(global_batch_size=64, seq_len=4096, dtype=DType.BF16, vocabulary_overlap=True)
"""Priced as the paper's schedule runs the split (its collectives behind the layers); the
planner's runtime's synchronous passes are the default (``test_run_synchronously_...``)."""
CLUSTER = make_cluster(per_node=8)


def _layout(vocabulary: VocabularyLayout = VOCAB_2, p: int = 4) -> Layout:
    return Layout(
        data_parallel_degree=8 // p,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        vocabulary_layout=vocabulary,
    )


def test_every_stage_holds_a_pth_of_both_vocabulary_matrices() -> None:
    v, h = MODEL.vocab_size, MODEL.hidden_size
    pinned = [stage_params(MODEL, _layout(PINNED), s) for s in range(4)]
    split = [stage_params(MODEL, _layout(VOCAB_2), s) for s in range(4)]
    # pinned: V h of embedding on stage 0, V h of output layer (+ final norm) on stage 3
    assert split[1].dense - pinned[1].dense == pytest.approx(2 * v * h / 4)
    assert pinned[0].dense - split[0].dense == pytest.approx(v * h - 2 * v * h / 4)
    assert sum(x.dense for x in split) == pytest.approx(sum(x.dense for x in pinned))
    assert [(x.embedding_share, x.output_share) for x in split] == [(0.25, 0.25)] * 4


def test_tensor_parallel_ranks_each_hold_their_stages_rows() -> None:
    # The runtime splits the vocabulary over the pipeline only: every tp rank holds V/p rows.
    v, h = MODEL.vocab_size, MODEL.hidden_size
    layout = replace(_layout(VOCAB_2), tensor_parallel_degree=2, data_parallel_degree=1)
    pinned = replace(layout, vocabulary_layout=PINNED)
    assert stage_params(MODEL, layout, 1).dense - stage_params(MODEL, pinned, 1).dense == pytest.approx(2 * v * h / 4)
    s = TRAINING.seq_len
    params = stage_params(MODEL, layout, 1)
    assert stage_logits_bytes(MODEL, TRAINING, layout, 1, params) == pytest.approx(2 * 4 * s * v / 4)
    # with sequence parallelism each takes its half of the sequence
    sp = replace(layout, sequence_parallel=True)
    assert stage_logits_bytes(MODEL, TRAINING, sp, 1, params) == pytest.approx(2 * 4 * s * v / 4 / 2)


@given(p=st.sampled_from([2, 4, 8]), tied=st.booleans())
def test_the_split_moves_parameters_and_loses_none(p: int, tied: bool) -> None:
    model = MODEL.model_copy(update={"tie_word_embeddings": tied})
    totals = {
        vocabulary: sum(stage_params(model, _layout(vocabulary, p), s).dense for s in range(p))
        for vocabulary in (PINNED, VOCAB_2)
    }
    # Pinned and tied, the last stage keeps a copy of the embedding (Megatron-LM); split, each
    # rank's output rows are its embedding rows.
    copy = model.vocab_size * model.hidden_size if tied else 0.0
    assert totals[PINNED] == pytest.approx(totals[VOCAB_2] + copy)


def test_one_and_two_more_micro_batches_in_flight() -> None:
    m = 8
    assert [in_flight_micro_batches(_layout(PINNED), s, m) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight_micro_batches(_layout(VOCAB_2), s, m) for s in range(4)] == [5, 4, 3, 2]
    assert [in_flight_micro_batches(_layout(VOCAB_1), s, m) for s in range(4)] == [6, 5, 4, 3]


def test_every_stage_keeps_two_softmax_shards_and_its_hidden_states() -> None:
    s, v, h = TRAINING.seq_len, MODEL.vocab_size, MODEL.hidden_size
    layout = _layout(VOCAB_2)
    for stage in range(4):
        params = stage_params(MODEL, layout, stage)
        assert stage_logits_bytes(MODEL, TRAINING, layout, stage, params) == pytest.approx(2 * 4 * s * v / 4)
    # X for two micro-batches and two dX partials, fp32; Algorithm 1 keeps no partials
    assert vocabulary_activation_bytes(MODEL, TRAINING, layout) == pytest.approx(4 * 4 * s * h)
    assert vocabulary_activation_bytes(MODEL, TRAINING, _layout(VOCAB_1)) == pytest.approx(2 * 4 * s * h)
    # the pinned last stage keeps two fp32 copies of the full logits (one awaiting backward, one gradient)
    last = stage_params(MODEL, _layout(PINNED), 3)
    assert stage_logits_bytes(MODEL, TRAINING, _layout(PINNED), 3, last) == pytest.approx(2 * 4 * s * v)
    # the first stage holds one more micro-batch of layers under the split than pinned
    extra = stage_activation_bytes(MODEL, TRAINING, layout, 0, stage_params(MODEL, layout, 0)) - (
        stage_activation_bytes(MODEL, TRAINING, _layout(PINNED), 0, stage_params(MODEL, _layout(PINNED), 0))
    )
    assert extra > vocabulary_activation_bytes(MODEL, TRAINING, layout)


def test_a_stage_waits_for_its_barriers_and_what_its_layers_do_not_hide() -> None:
    comm = VocabularyComm(embedding_s=2.0, output_s=3.0, barrier_s=1.0)
    assert comm.exposed_s(overlap_window_s=10.0) == 1.0
    assert comm.exposed_s(overlap_window_s=3.0) == 2.0
    # Algorithm 1 also waits on the input gradient's all-reduce
    groups = list(grp.pipeline_groups(_layout()))
    one = vocabulary_comm(MODEL, TRAINING, CLUSTER, _layout(VOCAB_1), groups)
    two = vocabulary_comm(MODEL, TRAINING, CLUSTER, _layout(VOCAB_2), groups)
    assert one.total_s == two.total_s and one.barrier_s > two.barrier_s > 0
    assert vocabulary_comm(MODEL, TRAINING, CLUSTER, _layout(PINNED), groups).total_s == 0.0


def test_where_communication_cannot_hide_each_pass_waits_on_the_stage_that_runs_it() -> None:
    comm = VocabularyComm(embedding_s=2.0, output_s=3.0, barrier_s=1.0)
    shares = {"embedding_share_s": 0.5, "output_share_s": 0.25}
    assert comm.exposed_s(10.0, overlapped=False, first=True, **shares) == 2.5
    assert comm.exposed_s(10.0, overlapped=False, last=True, **shares) == 3.25
    assert comm.exposed_s(10.0, overlapped=False, first=True, last=True, **shares) == 5.75
    assert comm.exposed_s(0.0, overlapped=False, **shares) == 0.0  # a middle stage joins from its service threads


def test_cpu_ranks_wait_in_full_on_the_first_and_last_stage_only() -> None:
    # On CPU ranks (gloo on the cores that compute) the runtime runs each pass synchronously: the
    # first stage waits for the embedding's collectives, the last for the output layer's, each
    # also for its peers' share of the pass; the middle stages wait for neither.
    model, cluster = load_model("tiny-gpt"), cpu_cluster(4)
    training = TrainingSpec(global_batch_size=32, seq_len=128, dtype=DType.BF16)
    layout = replace(_layout(VOCAB_2), data_parallel_degree=1, micro_batch_size=4)
    comm = vocabulary_comm(model, training, cluster, layout, grp.pipeline_groups(layout))
    output_s, embed_s = shared_kernels(model, training, cluster, layout).vocabulary_s
    waits = [t.vocabulary_comm_s for t in stage_times(model, training, cluster, layout)]
    assert waits == pytest.approx([comm.embedding_s + embed_s / 4, 0.0, 0.0, comm.output_s + output_s / 4])
    assert comm.embedding_s > 0 and comm.output_s > 0
    # the wait is not shortened by cores the other stages free: every pipeline rank takes part
    shared = cluster.model_copy(update={"device": cluster.device.model_copy(update={"core_share": 0.5})})
    alone = estimate(model, training, cluster, layout).time.pipeline_comm_s
    on_shared_cores = estimate(model, training, shared, layout).time.pipeline_comm_s
    assert on_shared_cores == pytest.approx(alone)


def test_run_synchronously_as_the_runtime_runs_it_a_rank_holds_torchs_warm_up() -> None:
    # The default: each pass runs when the stage needing it reaches it, within torch's 1F1B; on
    # GPUs as on CPUs the first and last stage wait for their passes in full, the others for none.
    # A pass's peak holds its fp32 softmax shard and lower-precision copies: two shards' worth.
    synchronous = TRAINING.model_copy(update={"vocabulary_overlap": False})
    s, v, h = TRAINING.seq_len, MODEL.vocab_size, MODEL.hidden_size
    layout = _layout(VOCAB_2)
    params = stage_params(MODEL, layout, 1)
    assert stage_logits_bytes(MODEL, synchronous, layout, 1, params) == pytest.approx(2 * 4 * s * v / 4)
    assert vocabulary_activation_bytes(MODEL, synchronous, layout) == pytest.approx(4 * 4 * s * h)
    in_flight = stage_activation_bytes(MODEL, TRAINING, layout, 1, params) - (
        stage_activation_bytes(MODEL, synchronous, layout, 1, params)
    )
    assert in_flight > 0  # the paper's schedule holds one more micro-batch
    assert [in_flight_micro_batches(layout, r, 8, vocabulary_warmup=False) for r in range(4)] == [4, 3, 2, 1]
    comm = vocabulary_comm(MODEL, TRAINING, CLUSTER, layout, grp.pipeline_groups(layout))
    output_s, embed_s = shared_kernels(MODEL, synchronous, CLUSTER, layout).vocabulary_s
    waits = [t.vocabulary_comm_s for t in stage_times(MODEL, synchronous, CLUSTER, layout)]
    assert waits == pytest.approx([comm.embedding_s + embed_s / 4, 0.0, 0.0, comm.output_s + output_s / 4])
    overlapped = [t.vocabulary_comm_s for t in stage_times(MODEL, TRAINING, CLUSTER, layout)]
    assert overlapped == pytest.approx([overlapped[0]] * 4) and overlapped[0] >= comm.barrier_s


def test_the_split_evens_out_the_last_stage() -> None:
    def times(vocabulary: VocabularyLayout) -> list[float]:
        layout = _layout(vocabulary)
        kw = {"tensor_groups": grp.tensor_groups(layout), "expert_groups": grp.expert_groups(layout)}
        return [st.compute_s for st in stage_times(MODEL, TRAINING, CLUSTER, layout, **kw)]  # type: ignore[arg-type]

    pinned, split = times(PINNED), times(VOCAB_2)
    assert pinned[3] > pinned[1] and pinned[0] > pinned[1]
    assert split[0] == pytest.approx(split[3]) and split[1] == pytest.approx(split[3])
    # the vocabulary work is spread, not lost: every stage does a quarter of it
    assert sum(split) == pytest.approx(sum(pinned))
    assert estimate(MODEL, TRAINING, CLUSTER, _layout(VOCAB_2)).step_time_s < (
        estimate(MODEL, TRAINING, CLUSTER, _layout(PINNED)).step_time_s
    )


def test_search_splits_a_256k_vocabulary_over_the_pipeline_when_it_pays() -> None:
    # llama3-70b with a 256k vocabulary on 32 H100s: the best plan pipelines, and the vocabulary
    # split beats pinning it, even with the CP-SAT layer split that prices the vocabulary layers. With
    # Megatron-LM's receive buffers: torch's, one per micro-batch, leave the split plans no room here.
    # Without full recompute: recomputing the first stages' first layers frees their memory as the
    # split does, and wins here (rc-full[5,1,0,0] at micro-batch 2, 35.9 s against 37.3).
    model = load_model("llama3-70b").model_copy(update={"name": "llama3-70b-256k", "vocab_size": 256_000})
    training = TrainingSpec(global_batch_size=256, seq_len=4096, pipeline_buffers=PipelineBuffers.PER_TRANSFER)
    settings = SearchSettings(
        top_k=5, vocabulary_layouts=(PINNED, VOCAB_2), constraints={"recompute": ["none", "selective"]}
    )
    plans = api.search(model, "dgx-h100:4", training, settings)
    best = plans[0].layout
    assert best.pipeline_parallel_degree > 1 and best.vocabulary_layout is VOCAB_2
    pinned = [p for p in plans if p.layout.pipeline_parallel_degree > 1 and p.layout.vocabulary_layout is PINNED]
    assert pinned and pinned[0].estimate.step_time_s > plans[0].estimate.step_time_s
    even = api.estimate(model, "dgx-h100:4", training, replace(best, vocabulary_layout=PINNED))
    assert even.step_time_s > 1.02 * plans[0].estimate.step_time_s


def test_a_mapped_layout_splits_the_vocabulary_under_tensor_parallelism() -> None:
    """The vocabulary layers' share is priced as one tp rank's (tp 1); the layout's device map,
    of a world t times larger, must not go with it (it raised SchemaError before). A map is a
    placement: the compute is the identity's."""
    layout = replace(_layout(VOCAB_2, p=2), data_parallel_degree=2, tensor_parallel_degree=2)
    mapped = replace(layout, device_map=DeviceMap(devices=(7, 6, 5, 4, 3, 2, 1, 0)))
    kw = {"tensor_groups": grp.tensor_groups(mapped), "expert_groups": grp.expert_groups(mapped)}
    priced = stage_times(MODEL, TRAINING, CLUSTER, mapped, **kw)  # type: ignore[arg-type]
    kw = {"tensor_groups": grp.tensor_groups(layout), "expert_groups": grp.expert_groups(layout)}
    identity = stage_times(MODEL, TRAINING, CLUSTER, layout, **kw)  # type: ignore[arg-type]
    assert [st.compute_s for st in priced] == [st.compute_s for st in identity]
