"""The learner's PPO update over named rows: what each minibatch trains on, and what goes down to the edge."""

from __future__ import annotations

import math

import pytest
import torch

from splitrl.core import precision as precision_module
from splitrl.core.models import cloud_network
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.learner import trainer as trainer_module
from splitrl.learner.algorithms import vtrace
from splitrl.learner.batch import Batch, Rows
from splitrl.learner.network import FusedAdam
from splitrl.learner.settings import LearnerSettings
from splitrl.learner.trainer import LossTerms, Trainer
from tests.chunks import training_batch

CHUNKS, HORIZON, WIDTH = 4, 8, 16
SPEC = ActionSpec("discrete", 3)
MODEL = ModelConfig(2, 36, WIDTH, "relu")


def batch(inputs: torch.Tensor) -> Batch:
    return training_batch(inputs)


def frames() -> torch.Tensor:
    return torch.randint(0, 256, (CHUNKS, HORIZON + 1, 2, 36, 36), dtype=torch.uint8)


def test_loss_terms_average_by_name_and_are_zero_when_nothing_trained():
    assert LossTerms.mean([]) == LossTerms(0.0, 0.0, 0.0, 0.0, 0.0)
    mean = LossTerms.mean([LossTerms(1, 2, 3, 4, 5), LossTerms(3, 4, 5, 6, 7)])
    assert mean.items() == [
        ("policy_loss", 2),
        ("value_loss", 3),
        ("entropy", 4),
        ("approx_kl", 5),
        ("clip_fraction", 6),
    ]


def test_a_cloud_update_takes_one_step_per_minibatch_of_every_epoch():
    settings = LearnerSettings(mode="cloud", tls="plaintext", epochs=3, minibatches=4)
    network = cloud_network("cloud", MODEL, SPEC)
    before = [p.detach().clone() for p in network.parameters()]
    stats = Trainer(network, settings).update(batch(frames()), version=0)
    assert (stats.optimizer_steps, stats.steps, len(stats.chunk_priorities)) == (12, CHUNKS * HORIZON, CHUNKS)
    assert all(torch.isfinite(torch.tensor(value)) for _, value in stats.losses.items())
    assert any(not torch.equal(a, b) for a, b in zip(before, network.parameters(), strict=True))


def test_a_bfloat16_update_computes_float32_gradients_close_to_float32s_and_steps_float32_weights():
    torch.manual_seed(0)  # the data: how close bfloat16 comes depends on it (a few biases' cosines reach ~0.9)
    data = batch(frames())
    rows = Rows.of(data, torch.randn(CHUNKS, HORIZON), torch.randn(CHUNKS, HORIZON), torch.zeros(CHUNKS, HORIZON))
    gradients = {}
    for precision in ("float32", "bfloat16"):
        torch.manual_seed(0)
        settings = LearnerSettings(mode="cloud", tls="plaintext", train_precision=precision)
        trainer = Trainer(cloud_network("cloud", MODEL, SPEC), settings)
        trainer._backward(rows, rows.inputs, entropy_coef=0.01)
        gradients[precision] = [p.grad for p in trainer.network.parameters()]
    assert all(gradient is not None and gradient.dtype == torch.float32 for gradient in gradients["bfloat16"])
    exact, rounded = (torch.cat([gradient.flatten() for gradient in gradients[p]]) for p in ("float32", "bfloat16"))
    cosine = torch.nn.functional.cosine_similarity(exact, rounded, dim=0)
    assert cosine > 0.97, cosine
    assert any(not torch.equal(a, b) for a, b in zip(gradients["float32"], gradients["bfloat16"], strict=True))
    before = [p.detach().clone() for p in trainer.network.parameters()]
    trainer.update(data, version=0)
    assert all(p.dtype == torch.float32 for p in trainer.network.parameters())
    assert all(state["exp_avg"].dtype == torch.float32 for state in trainer.optimizer.state.values())
    assert all(not torch.equal(a, b) for a, b in zip(before, trainer.network.parameters(), strict=True))


def test_bfloat16_on_a_cpu_without_it_warns_and_trains(monkeypatch, caplog):
    monkeypatch.setattr(precision_module, "cpu_has_native_bfloat16", lambda: False)
    settings = LearnerSettings(mode="cloud", tls="plaintext", train_precision="bfloat16", epochs=1, minibatches=1)
    with caplog.at_level("WARNING", logger=trainer_module.__name__):
        trainer = Trainer(cloud_network("cloud", MODEL, SPEC), settings)
    assert "without native bfloat16" in caplog.text
    assert trainer.update(batch(frames()), version=0).optimizer_steps == 1


def test_a_train_precision_other_than_float32_or_bfloat16_is_refused_with_the_value():
    with pytest.raises(ValueError, match=r"(?s)train_precision.*input_value=.float16"):
        LearnerSettings(mode="cloud", tls="plaintext", train_precision="float16")


def test_v_trace_takes_its_ratios_against_a_pass_in_the_training_precision():
    """With V-trace the ratio's denominator is the learner's own pass before the update: in the minibatches'
    precision and row count, so before any weight moves every ratio is exactly 1 (bfloat16 rounding would
    otherwise put ~0.01 of noise into its log)."""
    torch.manual_seed(0)
    data = batch(frames())
    settings = LearnerSettings(mode="cloud", tls="plaintext", correction="vtrace", train_precision="bfloat16")
    trainer = Trainer(cloud_network("cloud", MODEL, SPEC), settings)
    advantages, returns, old_log_probs = trainer._advantages(data)
    rows = Rows.of(data, advantages, returns, old_log_probs)
    minibatch = len(rows) // settings.minibatches
    order = torch.randperm(len(rows))
    for start in range(0, len(rows), minibatch):  # the passes an update's minibatches make, weights unchanged
        taken = rows.take(order[start : start + minibatch])
        with trainer._autocast():
            distribution, _ = trainer.network(taken.inputs)
        assert torch.equal(distribution.log_prob(taken.actions), taken.old_log_probs)


def test_v_trace_evaluates_an_update_a_minibatch_of_rows_at_a_time_as_one_pass_would():
    """The pass before a V-trace update runs the network on a minibatch's rows at a time (a whole CarRacing
    update at once allocated blocks past glibc's heap limit, faulted in afresh at every update), and gives the
    log-probs and values one pass over every row gives."""
    torch.manual_seed(0)
    data = batch(frames())
    settings = LearnerSettings(mode="cloud", tls="plaintext", correction="vtrace", minibatches=4)
    trainer = Trainer(cloud_network("cloud", MODEL, SPEC), settings)
    sizes: list[int] = []
    trainer.network.register_forward_pre_hook(lambda _, args: sizes.append(len(args[0])))
    advantages, returns, old_log_probs = trainer._advantages(data)
    rows = CHUNKS * (HORIZON + 1)
    minibatch = CHUNKS * HORIZON // 4  # an update's minibatch: its rows leave out each chunk's bootstrap step
    assert sizes == [minibatch] * (rows // minibatch) + [rows % minibatch]
    with torch.no_grad():
        distribution, values = trainer.network(data.inputs.reshape(rows, *data.inputs.shape[2:]))
    actions = torch.cat([data.actions, data.actions[:, -1:]], dim=1).reshape(rows)
    whole = distribution.log_prob(actions).reshape(CHUNKS, HORIZON + 1)[:, :-1]
    torch.testing.assert_close(old_log_probs, whole)
    expected = vtrace(
        data.behaviour_log_probs, whole, data.rewards * settings.reward_scale, values.reshape(CHUNKS, HORIZON + 1),
        data.dones, settings.gamma, lam=settings.gae_lambda,
    )  # fmt: skip
    torch.testing.assert_close(advantages, expected.pg_advantages)
    torch.testing.assert_close(returns, expected.value_targets)


def test_the_learning_rate_is_constant_unless_annealed_to_zero_over_the_given_steps():
    rows = CHUNKS * HORIZON  # agent steps per update
    constant = Trainer(cloud_network("cloud", MODEL, SPEC), LearnerSettings(mode="cloud", tls="plaintext"))
    assert constant.learning_rate_at(1_000, rows) == constant.settings.learning_rate
    settings = LearnerSettings(mode="cloud", tls="plaintext", learning_rate=1e-3, lr_anneal_steps=4 * rows)
    annealed = Trainer(cloud_network("cloud", MODEL, SPEC), settings)
    assert [annealed.learning_rate_at(v, rows) for v in range(6)] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4, 0, 0])
    stats = annealed.update(batch(frames()), version=2)  # the rate of the update after 2 updates of `rows` steps
    assert annealed.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4) == stats.learning_rate
    with pytest.raises(ValueError, match="lr_anneal_steps"):
        LearnerSettings(mode="cloud", tls="plaintext", lr_anneal_steps=0)


def test_the_entropy_bonus_anneals_to_zero_and_the_update_uses_it(monkeypatch):
    rows = CHUNKS * HORIZON
    settings = LearnerSettings(mode="cloud", tls="plaintext", entropy_coef=0.02, entropy_anneal_steps=2 * rows)
    annealed = Trainer(cloud_network("cloud", MODEL, SPEC), settings)
    assert [annealed.entropy_coef_at(v, rows) for v in range(4)] == pytest.approx([0.02, 0.01, 0, 0])
    assert annealed.learning_rate_at(3, rows) == settings.learning_rate  # each schedule has its own flag
    weights: list[float] = []
    real_loss = trainer_module.ppo_loss

    def recording_loss(*args, **kwargs):
        weights.append(kwargs["entropy_coef"])
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "ppo_loss", recording_loss)
    stats = annealed.update(batch(frames()), version=1)
    assert stats.optimizer_steps > 0 and stats.entropy_coef == pytest.approx(0.01)
    assert weights == pytest.approx([0.01] * stats.optimizer_steps)
    with pytest.raises(ValueError, match="entropy_anneal_steps"):
        LearnerSettings(mode="cloud", tls="plaintext", entropy_anneal_steps=0)


class RecordingEdges:
    def __init__(self) -> None:
        self.pushed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.learning_rate_scales: list[float] = []

    def fetch_activations(self, step_ids):  # pragma: no cover - split mode only
        raise AssertionError("split-accumulate trains on stored activations")

    def return_gradients(self, ticket, gradients, learning_rate_scale):  # pragma: no cover - split mode only
        raise AssertionError("split-accumulate pushes, it does not return")

    def push_gradients(self, step_ids, encoder_versions, gradients, learning_rate_scale):
        if len(step_ids):  # as EdgeLinks: no row, no message
            self.pushed.append((step_ids, gradients))
            self.learning_rate_scales.append(learning_rate_scale)


def test_split_accumulate_pushes_gradients_of_a_share_of_rows_by_step_id():
    settings = LearnerSettings(mode="split-accumulate", tls="plaintext", epochs=2, minibatches=2, encoder_fraction=0.5)
    edges = RecordingEdges()
    activations = torch.randn(CHUNKS, HORIZON + 1, WIDTH).to(torch.bfloat16)
    stats = Trainer(cloud_network("split-accumulate", MODEL, SPEC), settings, edges).update(
        batch(activations), version=0
    )
    assert stats.optimizer_steps == 4
    assert [len(ids) for ids, _ in edges.pushed] == [8] * 4  # half of each minibatch's 16 rows
    pushed_ids = torch.cat([ids for ids, _ in edges.pushed])
    assert all(gradients.shape == (len(ids), WIDTH) for ids, gradients in edges.pushed)
    assert not set(pushed_ids.tolist()) & {HORIZON, 2 * HORIZON + 1}  # bootstrap steps are never trained


def test_split_accumulate_sends_gradients_down_only_in_its_last_encoder_epochs():
    """encoder_epochs=1, fraction 1: every row's gradient goes down exactly once per update; the head still
    trains every epoch."""
    settings = LearnerSettings(
        mode="split-accumulate", tls="plaintext", epochs=3, minibatches=2, encoder_fraction=1.0, encoder_epochs=1
    )
    edges = RecordingEdges()
    network = cloud_network("split-accumulate", MODEL, SPEC)
    activations = torch.randn(CHUNKS, HORIZON + 1, WIDTH).to(torch.bfloat16)
    stats = Trainer(network, settings, edges).update(batch(activations), version=0)
    assert stats.optimizer_steps == 6 and len(edges.pushed) == 2  # one push per minibatch of the last epoch
    pushed_ids = torch.cat([ids for ids, _ in edges.pushed]).tolist()
    assert sorted(pushed_ids) == sorted(set(pushed_ids)) and len(pushed_ids) == CHUNKS * HORIZON


@pytest.mark.parametrize(("version", "scale"), [(0, 1.0), (1, 0.75), (3, 0.25), (5, 0.0)])
def test_the_edges_encoder_anneals_with_the_head(version, scale):
    """With lr_anneal_steps every gradient pushed down carries the update's rate over the initial one, so the
    edge's encoder follows the same schedule as the head (to 0 at the last annealed step)."""
    rows = CHUNKS * HORIZON
    settings = LearnerSettings(
        mode="split-accumulate",
        tls="plaintext",
        epochs=1,
        minibatches=2,
        encoder_fraction=1.0,
        lr_anneal_steps=4 * rows,
    )
    edges = RecordingEdges()
    activations = torch.randn(CHUNKS, HORIZON + 1, WIDTH).to(torch.bfloat16)
    stats = Trainer(cloud_network("split-accumulate", MODEL, SPEC), settings, edges).update(
        batch(activations), version=version
    )
    assert edges.learning_rate_scales == pytest.approx([scale, scale])
    assert stats.learning_rate == pytest.approx(settings.learning_rate * scale)


class TwoRanksTraining:
    """A data-parallel group as the trainer sees it: both ranks trained every minibatch, and (as if the other
    rank's gradients equalled this one's) the averaged gradient is this rank's own."""

    rank, world_size = 0, 2

    def average_gradients(self, parameters, trained):
        return 2 if trained else 0


def test_with_ranks_the_encoder_gradient_is_scaled_by_the_ranks_that_trained():
    """The group's loss is the mean of the ranks' losses, so the rows sent down are 1/2 of one learner's."""
    settings = LearnerSettings(mode="split-accumulate", tls="plaintext", epochs=1, minibatches=1, encoder_fraction=1)
    activations = torch.randn(CHUNKS, HORIZON + 1, WIDTH).to(torch.bfloat16)
    pushed = []
    for parallel in (None, TwoRanksTraining()):
        edges = RecordingEdges()
        torch.manual_seed(0)
        trainer = Trainer(cloud_network("split-accumulate", MODEL, SPEC), settings, edges, parallel)  # type: ignore[arg-type]
        trainer.update(batch(activations), version=0)
        ((_, gradients),) = edges.pushed
        pushed.append(gradients)
    alone, in_group = pushed
    assert alone.abs().sum() > 0 and torch.allclose(in_group, alone / 2)


class FreshEdges:
    """Split mode's edge: answers every fetch with activations of 7.0 (the stored rollout ones are 0), all
    present; records each fetch and each gradient return."""

    def __init__(self) -> None:
        self.fetched: list[torch.Tensor] = []
        self.returned: list[torch.Tensor] = []

    def fetch_activations(self, step_ids):
        if len(step_ids):  # as EdgeLinks: no row, no message
            self.fetched.append(step_ids)
        return torch.full((len(step_ids), WIDTH), 7.0), torch.ones(len(step_ids), dtype=torch.bool), len(step_ids)

    def return_gradients(self, ticket, gradients, learning_rate_scale):
        assert ticket == len(gradients) and learning_rate_scale == 1.0  # no schedule in these tests
        if ticket:
            self.returned.append(gradients)

    def push_gradients(self, step_ids, encoder_versions, gradients, learning_rate_scale):  # pragma: no cover
        raise AssertionError("split mode returns gradients, it does not push")


class InputRecorder(torch.nn.Module):
    """The head, recording what each forward pass reads."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head, self.inputs = head, []

    def forward(self, inputs):
        self.inputs.append(inputs.detach().clone())
        return self.head(inputs)


@pytest.mark.parametrize(("encoder_epochs", "exchanges"), [(None, 6), (1, 2), (2, 4)])
def test_split_trains_the_head_on_stored_activations_then_exchanges_with_the_edge_in_its_last_encoder_epochs(
    encoder_epochs, exchanges
):
    settings = LearnerSettings(mode="split", tls="plaintext", epochs=3, minibatches=2, encoder_epochs=encoder_epochs)
    edges = FreshEdges()
    network = InputRecorder(cloud_network("split", MODEL, SPEC))
    stored = torch.zeros(CHUNKS, HORIZON + 1, WIDTH, dtype=torch.bfloat16)  # what the edge sent when acting
    stats = Trainer(network, settings, edges).update(batch(stored), version=0)
    assert stats.optimizer_steps == 6
    assert len(edges.fetched) == len(edges.returned) == exchanges
    assert set(torch.cat(edges.fetched[-2:]).tolist()) == set(range(CHUNKS * (HORIZON + 1))) - {
        (chunk + 1) * (HORIZON + 1) - 1 for chunk in range(CHUNKS)
    }  # the last epoch asks for every row once (never a chunk's bootstrap step)
    head_only = 2 * (3 - (encoder_epochs or 3))  # forward passes before the encoder epochs
    assert all(bool((inputs == 0.0).all()) for inputs in network.inputs[:head_only])  # the rollout's activations
    assert all(bool((inputs == 7.0).all()) for inputs in network.inputs[head_only:])  # the edge's fresh ones


def test_split_with_an_encoder_fraction_fetches_a_share_of_rows_and_trains_the_rest_on_stored_activations():
    """encoder_fraction 0.5: about half of each minibatch's rows cross the WAN (up and down); every row still
    trains the head, the drawn ones on the edge's fresh activations, the others on the rollout's."""
    settings = LearnerSettings(mode="split", tls="plaintext", epochs=2, minibatches=2, encoder_fraction=0.5)
    edges = FreshEdges()
    network = InputRecorder(cloud_network("split", MODEL, SPEC))
    stored = torch.zeros(CHUNKS, HORIZON + 1, WIDTH, dtype=torch.bfloat16)
    stats = Trainer(network, settings, edges).update(batch(stored), version=0)
    assert stats.optimizer_steps == 4 and len(edges.fetched) == len(edges.returned) == 4
    assert [len(ids) for ids in edges.fetched] == [8] * 4  # half of each minibatch's 16 rows
    assert [len(gradients) for gradients in edges.returned] == [len(ids) for ids in edges.fetched]
    assert all(bool(gradients.abs().sum(dim=1).gt(0).all()) for gradients in edges.returned)  # every drawn row
    rows_read = sum(len(inputs) for inputs in network.inputs)
    fresh = [int((inputs == 7.0).all(dim=1).sum()) for inputs in network.inputs]
    stale = [int((inputs == 0.0).all(dim=1).sum()) for inputs in network.inputs]
    assert rows_read == 2 * CHUNKS * HORIZON  # no row is left out of the head's training
    assert fresh[:2] == [len(ids) for ids in edges.fetched[:2]] and sum(fresh) + sum(stale) == rows_read
    assert sum(fresh[2:]) >= sum(len(ids) for ids in edges.fetched[2:])  # the second epoch also reads written-back rows


@pytest.mark.parametrize("fraction", [0.3, 0.25, 0.05])
def test_the_encoder_rows_drawn_are_the_share_rounded_at_random_to_one_of_two_sizes(fraction):
    """The edge trains on one or two minibatch sizes (a coin flip per row gave dozens), the share exact on
    average, and over many draws every row is drawn about as often as any other."""
    settings = LearnerSettings(mode="split", tls="plaintext", encoder_fraction=fraction)
    trainer = Trainer(cloud_network("split", MODEL, SPEC), settings, FreshEdges())
    masks = torch.stack([trainer._draw_encoder_rows(16) for _ in range(4000)])
    sizes = masks.sum(dim=1)
    expected = 16 * fraction
    assert set(sizes.tolist()) <= {math.floor(expected), math.ceil(expected)}
    assert abs(sizes.float().mean().item() - expected) < 0.05
    assert (masks.float().mean(dim=0) - fraction).abs().max() < 0.04  # no row favoured


def test_split_leaves_out_a_drawn_row_the_edge_no_longer_holds():
    class ForgetfulEdges(FreshEdges):
        def fetch_activations(self, step_ids):
            fetched, present, ticket = super().fetch_activations(step_ids)
            present[::2] = False
            fetched[~present] = 0.0
            return fetched, present, ticket

    settings = LearnerSettings(mode="split", tls="plaintext", epochs=1, minibatches=1)
    network = InputRecorder(cloud_network("split", MODEL, SPEC))
    stored = torch.zeros(CHUNKS, HORIZON + 1, WIDTH, dtype=torch.bfloat16)
    Trainer(network, settings, ForgetfulEdges()).update(batch(stored), version=0)
    (inputs,) = network.inputs
    assert len(inputs) == CHUNKS * HORIZON // 2 and bool((inputs == 7.0).all())


def test_split_with_encoder_fraction_zero_trains_the_head_alone_and_sends_nothing():
    settings = LearnerSettings(mode="split", tls="plaintext", epochs=2, minibatches=2, encoder_fraction=0.0)
    edges = FreshEdges()
    network = InputRecorder(cloud_network("split", MODEL, SPEC))
    stored = torch.zeros(CHUNKS, HORIZON + 1, WIDTH, dtype=torch.bfloat16)
    stats = Trainer(network, settings, edges).update(batch(stored), version=0)
    assert stats.optimizer_steps == 4 and edges.fetched == edges.returned == []
    assert all(bool((inputs == 0.0).all()) for inputs in network.inputs)


def test_the_trainer_steps_with_the_fused_adam():
    settings = LearnerSettings(mode="cloud", tls="plaintext")
    assert isinstance(Trainer(cloud_network("cloud", MODEL, SPEC), settings).optimizer, FusedAdam)


def test_the_trainer_keeps_freed_blocks_in_the_heap_for_the_next_minibatch(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(trainer_module, "reuse_freed_blocks", lambda: calls.append("reuse") or True)
    Trainer(cloud_network("cloud", MODEL, SPEC), LearnerSettings(mode="cloud", tls="plaintext"))
    assert calls == ["reuse"]


def test_a_step_whose_gradients_are_not_finite_is_skipped_and_the_weights_stay_as_they_were():
    """A NaN reward (past every check) makes the loss NaN: without the skip, one Adam step makes every weight NaN
    for good."""
    settings = LearnerSettings(mode="cloud", tls="plaintext", epochs=2, minibatches=2)
    network = cloud_network("cloud", MODEL, SPEC)
    before = [p.detach().clone() for p in network.parameters()]
    poisoned = batch(frames())
    poisoned.rewards[:, -1] = float("nan")  # GAE carries it back to every step of every chunk
    trainer = Trainer(network, settings)
    stats = trainer.update(poisoned, version=0)
    assert (stats.optimizer_steps, trainer.skipped_steps) == (0, 4)
    assert all(torch.equal(a, b) for a, b in zip(before, network.parameters(), strict=True))
    assert trainer.update(batch(frames()), version=1).optimizer_steps == 4  # a good batch trains as before
    assert all(bool(torch.isfinite(p).all()) for p in network.parameters())
