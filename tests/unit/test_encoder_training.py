"""The edge's half of split training: step ids and the encoder's gradient steps (the store: its own tests)."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry

from splitrl.core import precision as precision_module
from splitrl.core import wire
from splitrl.core.config import Precision
from splitrl.core.framestack import FrameRow
from splitrl.core.metrics import Metrics
from splitrl.core.models import Encoder
from splitrl.core.rpc import BadRequest
from splitrl.core.spec import Bottleneck
from splitrl.core.step_ids import (
    MAX_PREFIX,
    STEP_ID_BITS,
    first_id,
    new_prefix,
    pack_step_ids,
    prefix_of,
    unpack_step_ids,
)
from splitrl.edge_encoder.observation_store import ObservationStore
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.edge_encoder.training import EncoderTrainer, padded_to, rows_to_run
from splitrl.v1 import training_pb2

WIDTH = 32


def stacks(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 4, 36, 36), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def as_rows(stacked: torch.Tensor) -> list[FrameRow]:
    """Stacks [n, depth, H, W] as the store takes them: rows of frames (here none shared)."""
    return [tuple(stack.unbind()) for stack in stacked]


def make_trainer(
    capacity: int = 100, rows_per_pass: int = 0, precision: Precision = "float32", bottleneck: Bottleneck = "relu"
) -> tuple[EncoderTrainer, Metrics]:
    torch.manual_seed(0)
    metrics = Metrics(CollectorRegistry())
    trainer = EncoderTrainer(
        Encoder(4, 36, WIDTH, bottleneck),
        ObservationStore(capacity),
        metrics,
        learning_rate=1e-3,
        max_grad_norm=0.5,
        rows_per_pass=rows_per_pass,
        precision=precision,
    )
    return trainer, metrics


def test_prefixes_route_ids_and_stay_inside_int64():
    for _ in range(100):
        prefix = new_prefix()
        assert 1 <= prefix < MAX_PREFIX
        last_id = first_id(prefix) + (1 << STEP_ID_BITS) - 1
        ids = torch.tensor([first_id(prefix), last_id])  # int64: would overflow past 2**63
        assert prefix_of(ids).tolist() == [prefix, prefix] and last_id < 2**63


def test_step_ids_pack_as_deltas_in_any_order_and_ascending_ids_cost_a_byte_each():
    base = first_id(MAX_PREFIX - 1)  # the largest prefix: a whole id is a 9-byte varint
    shuffled = [base + 7, base + 2, base + 900, base + 3]
    assert unpack_step_ids(pack_step_ids(shuffled)) == shuffled
    recent = torch.randperm(1024, generator=torch.Generator().manual_seed(0))[:128].sort().values + base
    packed = pack_step_ids(recent.tolist())
    assert unpack_step_ids(packed) == recent.tolist()
    assert packed.ByteSize() <= 12 + 128  # vs 128 x 9 = 1,152 bytes as repeated uint64
    with pytest.raises(ValueError, match="at least one"):
        pack_step_ids([])


def test_split_gradients_train_the_encoder_through_the_kept_graph():
    trainer, metrics = make_trainer()
    trainer.store.put([1, 2, 3], as_rows(stacks(3)))
    before = [p.detach().clone() for p in trainer.encoder.parameters()]
    answer = trainer.activations(training_pb2.ActivationRequest(request_id=7, steps=pack_step_ids([1, 3, 42])))
    assert list(answer.missing_step_ids) == [42]
    rows = wire.decode(answer.activations, expect_dtype=wire.DTYPE_BFLOAT16, expect_shape=[2, WIDTH])
    gradients = torch.ones_like(rows)
    applied = trainer.apply(
        training_pb2.EncoderGradients(request_id=7, gradients=wire.encode(gradients, wire.DTYPE_BFLOAT16))
    )
    assert applied.encoder_version == trainer.version == 1 and applied.unknown_step_ids == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.encoder.parameters(), strict=True))
    assert metrics.unknown_step_ids.labels(request="activation")._value.get() == 1


def test_gradients_for_an_unknown_request_are_counted_not_applied():
    trainer, metrics = make_trainer()
    message = training_pb2.EncoderGradients(
        request_id=99, gradients=wire.encode(torch.ones(2, WIDTH), wire.DTYPE_BFLOAT16)
    )
    applied = trainer.apply(message)
    assert applied.unknown_step_ids == 2 and applied.encoder_version == 0
    assert metrics.unknown_step_ids.labels(request="gradient")._value.get() == 2


def test_accumulate_gradients_recompute_the_forward_pass_and_skip_evicted_steps():
    trainer, metrics = make_trainer(capacity=2)
    trainer.store.put([1, 2, 3], as_rows(stacks(3)))  # 1 is evicted
    message = training_pb2.EncoderGradients(
        request_id=5,
        steps=pack_step_ids([3, 1, 2]),
        gradients=wire.encode(torch.ones(3, WIDTH), wire.DTYPE_BFLOAT16),
    )
    applied = trainer.apply(message)
    assert applied.unknown_step_ids == 1 and applied.encoder_version == 1
    assert metrics.encoder_updates._value.get() == 1


def accumulate_gradients(learning_rate_scale: float | None) -> training_pb2.EncoderGradients:
    message = training_pb2.EncoderGradients(
        request_id=5,
        steps=pack_step_ids([1, 2]),
        gradients=wire.encode(torch.ones(2, WIDTH), wire.DTYPE_BFLOAT16),
    )
    if learning_rate_scale is not None:
        message.learning_rate_scale = learning_rate_scale
    return message


def encoder_step(learning_rate_scale: float | None) -> torch.Tensor:
    """The change in the encoder's parameters (flattened) from one accumulate step at `learning_rate_scale`."""
    trainer, _ = make_trainer()
    trainer.store.put([1, 2], as_rows(stacks(2)))
    before = torch.cat([p.detach().flatten() for p in trainer.encoder.parameters()])
    trainer.apply(accumulate_gradients(learning_rate_scale))
    assert trainer.version == 1
    return torch.cat([p.detach().flatten() for p in trainer.encoder.parameters()]) - before


def test_the_encoder_steps_at_the_learners_share_of_its_learning_rate():
    """Adam's first step moves each parameter by about lr (its update is m / sqrt(v) = +-1), so the step at a
    quarter of the rate is a quarter of the step at the whole rate; unset means the whole rate."""
    whole, unset = encoder_step(1.0), encoder_step(None)
    assert whole.abs().max() > 0 and torch.equal(whole, unset)
    assert torch.allclose(encoder_step(0.25), whole / 4, atol=1e-7)
    assert torch.equal(encoder_step(0.0), torch.zeros_like(whole))  # annealed to 0: the encoder stands still


@pytest.mark.parametrize("scale", [-0.5, 1.5, float("nan"), float("inf")])
def test_a_learning_rate_scale_outside_0_1_is_refused_with_the_value(scale):
    trainer, _ = make_trainer()
    trainer.store.put([1, 2], as_rows(stacks(2)))
    with pytest.raises(BadRequest, match="learning_rate_scale must be in \\[0, 1\\], got"):
        trainer.apply(accumulate_gradients(scale))
    assert trainer.version == 0 and trainer.optimizer.param_groups[0]["lr"] == 1e-3


def train_once(
    rows_per_pass: int,
    accumulate: bool,
    precision: Precision = "float32",
    rows: int = 5,
    bottleneck: Bottleneck = "relu",
) -> tuple[EncoderTrainer, torch.Tensor, list[tuple[int, bool]]]:
    """One split (or split-accumulate) step over `rows` stored rows; returns the trainer, the activations it sent
    (split) and each encoder forward pass as (rows it ran on, with a graph)."""
    trainer, _ = make_trainer(rows_per_pass=rows_per_pass, precision=precision, bottleneck=bottleneck)
    passes: list[tuple[int, bool]] = []
    trainer.encoder.register_forward_hook(
        lambda _m, inputs, _o: passes.append((inputs[0].shape[0], torch.is_grad_enabled()))
    )
    ids = list(range(11, 11 + rows))
    trainer.store.put(ids, as_rows(stacks(rows, seed=3)))
    gradients = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(4))
    sent = torch.zeros(0)
    message = training_pb2.EncoderGradients(request_id=9, gradients=wire.encode_float(gradients, "bf16"))
    if accumulate:
        message.steps.CopyFrom(pack_step_ids(ids))
    else:
        answer = trainer.activations(training_pb2.ActivationRequest(request_id=9, steps=pack_step_ids(ids)))
        sent = wire.decode_float(answer.activations)
    assert trainer.apply(message).encoder_version == 1
    return trainer, sent, passes


@pytest.mark.parametrize(
    ("rows", "rows_per_pass", "whole_pass", "piece_sizes"),
    [
        (5, 2, 8, [2, 2, 2]),  # the last piece's one row runs as 2, so every pass has the same size
        (13, 12, 16, [12, 8]),  # 12 and 1, the 1 padded to 8 (a multiple of 8 under 12), not to 12
    ],
)
@pytest.mark.parametrize("accumulate", [False, True], ids=["split", "split-accumulate"])
def test_training_in_passes_of_a_few_rows_takes_the_same_step_with_a_graph_of_those_rows_only(
    accumulate, rows, rows_per_pass, whole_pass, piece_sizes
):
    whole, whole_sent, whole_passes = train_once(0, accumulate, rows=rows)
    pieces, pieces_sent, piece_passes = train_once(rows_per_pass, accumulate, rows=rows)
    assert torch.allclose(whole_sent, pieces_sent)
    for a, b in zip(whole.encoder.parameters(), pieces.encoder.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    # one pass with a graph, padded to a multiple of 8 rows: kept from the activations (split), or run at once
    assert whole_passes == [(whole_pass, True)]
    # split sends activations made without a graph, then runs the rows again, in pieces, when gradients come
    assert piece_passes == [(size, False) for size in piece_sizes if not accumulate] + [
        (size, True) for size in piece_sizes
    ]


@pytest.mark.parametrize("bottleneck", ["relu", "layernorm"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["split", "split-accumulate"])
def test_a_padded_training_pass_sends_and_trains_its_own_rows_activations(accumulate, bottleneck):
    trainer, sent, passes = train_once(0, accumulate, bottleneck=bottleneck)
    assert passes == [(8, True)]
    torch.manual_seed(0)
    reference = Encoder(4, 36, WIDTH, bottleneck)  # the trainer's initial weights, run on the 5 rows alone
    activations = reference(stacks(5, seed=3))
    if not accumulate:  # the rows sent are the 5 rows' own activations, not the padding's
        assert sent.shape == (5, WIDTH)
        assert torch.allclose(sent, activations.detach().bfloat16().float())
    gradients = torch.randn(5, WIDTH, generator=torch.Generator().manual_seed(4))
    (activations * wire.decode_float(wire.encode_float(gradients, "bf16"))).sum().backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    assert torch.allclose(flat_gradients(trainer), torch.cat([p.grad.flatten() for p in reference.parameters()]))


def test_training_passes_of_any_rows_run_at_a_few_sizes():
    assert {rows_to_run(rows, 0) for rows in range(1, 33)} == {8, 16, 24, 32}
    assert [rows_to_run(rows, 0) for rows in (0, 1, 8, 9, 127, 128)] == [0, 8, 8, 16, 128, 128]
    # passes in pieces of N rows (rows_per_pass) run at N, or at fewer rounded up when the request has fewer
    assert {rows_to_run(rows, 2) for rows in (1, 2)} == {2}
    assert [rows_to_run(rows, 12) for rows in (1, 5, 9, 12)] == [8, 8, 12, 12]
    with pytest.raises(ValueError, match="a pass of 13 rows is over rows_per_pass=12"):
        rows_to_run(13, 12)
    three = stacks(3)
    padded = padded_to(three, 8)
    assert torch.equal(padded[:3], three) and not padded[3:].any()
    assert padded_to(three, 3) is three  # no copy when nothing is missing
    with pytest.raises(ValueError, match="cannot pad 3 rows to 2"):
        padded_to(three, 2)


def flat_gradients(trainer: EncoderTrainer) -> torch.Tensor:
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainer.encoder.parameters())
    return torch.cat([p.grad.flatten() for p in trainer.encoder.parameters() if p.grad is not None])


@pytest.mark.parametrize("accumulate", [False, True], ids=["split", "split-accumulate"])
def test_a_bfloat16_encoder_sends_and_trains_close_to_float32_with_float32_weights_and_state(accumulate):
    exact, exact_sent, _ = train_once(0, accumulate)
    rounded, rounded_sent, _ = train_once(0, accumulate, precision="bfloat16")
    if not accumulate:  # the activations it sent: as the codec sent float32's, within bfloat16's rounding
        assert not torch.equal(exact_sent, rounded_sent)
        assert (rounded_sent - exact_sent).norm() / exact_sent.norm() < 0.02
    cosine = torch.nn.functional.cosine_similarity(flat_gradients(exact), flat_gradients(rounded), dim=0)
    assert 0.97 < cosine < 1, cosine  # rounded (not float32 passes), and still the same direction
    assert all(p.dtype == torch.float32 for p in rounded.encoder.parameters())
    assert all(state["exp_avg"].dtype == torch.float32 for state in rounded.optimizer.state.values())


@pytest.mark.parametrize("accumulate", [False, True], ids=["split", "split-accumulate"])
def test_a_bfloat16_encoder_in_passes_of_a_few_rows_sends_and_steps_as_in_one_pass(accumulate):
    whole, whole_sent, _ = train_once(0, accumulate, precision="bfloat16")
    pieces, pieces_sent, _ = train_once(2, accumulate, precision="bfloat16")
    assert pieces_sent.dtype == torch.float32 and torch.allclose(whole_sent, pieces_sent, rtol=1e-2, atol=1e-2)
    cosine = torch.nn.functional.cosine_similarity(flat_gradients(whole), flat_gradients(pieces), dim=0)
    assert cosine > 0.99, cosine


def test_a_bfloat16_encoder_acts_in_float32_activations_close_to_float32s():
    batch = stacks(6, seed=5)
    exact = make_trainer()[0].encode(batch)
    rounded = make_trainer(precision="bfloat16")[0].encode(batch)
    assert rounded.dtype == torch.float32 and rounded.shape == (6, WIDTH) and not rounded.requires_grad
    assert not torch.equal(exact, rounded) and (rounded - exact).norm() / exact.norm() < 0.02


def test_a_bfloat16_encoder_on_a_cpu_without_it_warns(monkeypatch, caplog):
    monkeypatch.setattr(precision_module, "cpu_has_native_bfloat16", lambda: False)
    with caplog.at_level("WARNING"):
        make_trainer(precision="bfloat16")
    assert "encoder_precision='bfloat16' on a CPU without native bfloat16" in caplog.text


def test_an_encoder_precision_other_than_float32_or_bfloat16_is_refused_with_the_value():
    with pytest.raises(ValueError, match=r"(?s)encoder_precision.*input_value=.float16"):
        EdgeEncoderSettings(tls="plaintext", encoder_precision="float16")


def test_each_step_counts_its_rows_float_inputs_towards_the_next_heap_trim():
    trainer, _ = make_trainer()
    trainer.store.put([1, 2], as_rows(stacks(2)))
    trainer.apply(accumulate_gradients(None))
    assert trainer._freed.pending_bytes == 2 * 4 * (4 * 36 * 36)  # 2 rows of 4 x 36 x 36 float32, under 8 MiB


def test_a_negative_rows_per_pass_is_refused_with_the_value():
    with pytest.raises(ValueError, match="rows_per_pass must be >= 0, got -1"):
        make_trainer(rows_per_pass=-1)


@pytest.mark.parametrize(
    "message, error",
    [
        (training_pb2.EncoderGradients(request_id=1, steps=pack_step_ids([1, 2])), "dtype"),
        (
            training_pb2.EncoderGradients(
                request_id=1,
                steps=pack_step_ids([1, 2]),
                gradients=wire.encode(torch.ones(2, WIDTH + 1), wire.DTYPE_BFLOAT16),
            ),
            "expected \\[n, width\\]",
        ),
        (
            training_pb2.EncoderGradients(
                request_id=1,
                steps=pack_step_ids([1]),
                gradients=wire.encode(torch.ones(2, WIDTH), wire.DTYPE_BFLOAT16),
            ),
            "1 step ids for 2 rows",
        ),
        (
            training_pb2.EncoderGradients(
                request_id=1,
                steps=training_pb2.StepIds(first=1, deltas=[-2]),
                gradients=wire.encode(torch.ones(2, WIDTH), wire.DTYPE_BFLOAT16),
            ),
            "outside \\[0, 2\\*\\*63\\)",
        ),
        (
            training_pb2.EncoderGradients(
                request_id=1,
                steps=training_pb2.StepIds(first=2**63 - 1, deltas=[1]),
                gradients=wire.encode(torch.ones(2, WIDTH), wire.DTYPE_BFLOAT16),
            ),
            "outside \\[0, 2\\*\\*63\\)",
        ),
    ],
)
def test_malformed_gradients_are_refused_with_a_reason(message, error):
    trainer, _ = make_trainer()
    trainer.store.put([1, 2], as_rows(stacks(2)))
    with pytest.raises((BadRequest, wire.WireError), match=error):
        trainer.apply(message)
    assert trainer.version == 0


def test_encoder_checkpoint_restores_weights_optimizer_and_version(tmp_path):
    path = tmp_path / "encoder.pt"
    torch.manual_seed(0)
    trainer = EncoderTrainer(
        Encoder(4, 36, WIDTH),
        ObservationStore(100),
        Metrics(CollectorRegistry()),
        learning_rate=1e-3,
        max_grad_norm=0.5,
        checkpoint_path=path,
        checkpoint_every=2,
    )
    trainer.store.put([1, 2], as_rows(stacks(2)))
    for step in range(3):
        message = training_pb2.EncoderGradients(
            request_id=step,
            steps=pack_step_ids([1, 2]),
            gradients=wire.encode(torch.ones(2, WIDTH), wire.DTYPE_BFLOAT16),
        )
        trainer.apply(message)
        assert path.exists() == (step >= 1)  # saved every 2 steps
    saved = {name: value.clone() for name, value in trainer.encoder.state_dict().items()}
    trainer.save_checkpoint()  # shutdown: step 3 is saved too

    torch.manual_seed(0)  # the seed weights, which a restart without a checkpoint would go back to
    restarted = EncoderTrainer(
        Encoder(4, 36, WIDTH),
        ObservationStore(100),
        Metrics(CollectorRegistry()),
        learning_rate=1e-3,
        max_grad_norm=0.5,
        checkpoint_path=path,
    )
    assert restarted.version == 3
    for name, value in restarted.encoder.state_dict().items():
        assert torch.equal(value, saved[name]), name
    assert restarted.optimizer.state_dict()["state"][0]["step"] == 3
    assert sorted(p.name for p in tmp_path.glob("*.tmp")) == []  # written whole, renamed into place


def test_an_encoder_that_never_stepped_is_still_saved_at_shutdown(tmp_path):
    """A frozen encoder (--encoder-fraction 0) takes no step; eval and a resumed edge still need its weights."""
    path = tmp_path / "encoder.pt"
    trainer = EncoderTrainer(
        Encoder(4, 36, WIDTH), ObservationStore(10), Metrics(CollectorRegistry()), learning_rate=1e-3,
        max_grad_norm=0.5, checkpoint_path=path,
    )  # fmt: skip
    trainer.save_checkpoint()
    assert path.exists()
    modified = path.stat().st_mtime_ns
    trainer.save_checkpoint()  # nothing new: not written again
    assert path.stat().st_mtime_ns == modified
