"""condreg.attacks.finetune and its two scalars: every attacker trains what it says and nothing
else, the caller's model and random state are untouched, the rate sweep is recorded and chosen on
held-out data only, and the deficit / steps-to-target are defined as documented."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from torch import nn  # noqa: E402

from condreg.attacks import (  # noqa: E402
    FINETUNE_ATTACKERS,
    LR_GRIDS,
    FinetuneResult,
    finetune,
    finetune_deficit,
    finetune_search,
    steps_to_target,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class _Block(nn.Module):
    """A conv, a grouped conv, a Linear behind a pool: LoRA's two layer kinds and a non-target."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 6)

    def forward(self, x):
        h = torch.relu(self.grouped(torch.relu(self.conv(x)))).mean((2, 3))
        return self.fc(self.norm(h))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
    return nn.Sequential(collections.OrderedDict(stem=stem, block=_Block()))


def _data(n=160, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    X = 0.5 * torch.randn(n, 1, 6, 6, generator=g)
    X[:, 0, 1, 1] += 2.0 * y  # a learnable signal
    return (X[: n * 3 // 4], y[: n * 3 // 4]), (X[n * 3 // 4 :], y[n * 3 // 4 :])


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


EXPECTED = {
    "linear_probe": set(),
    "whitened_probe": set(),
    "lstsq_probe": set(),
    "lora": set(),
    "finetune_block": {n for n, _ in _model().named_parameters() if n.startswith("block.")},
    "finetune_all": {n for n, _ in _model().named_parameters()},
}


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("attacker", FINETUNE_ATTACKERS)
def test_changed_is_what_the_attacker_trains_and_the_callers_model_is_untouched(
    attacker, optimizer
):
    model, (train, test) = _model(), _data()
    before, rng = _state(model), torch.random.get_rng_state()
    lr = 0.05 if optimizer == "sgd" else 0.01
    res = finetune(
        model,
        train,
        test,
        attacker=attacker,
        block="block",
        optimizer=optimizer,
        steps=12,
        lr=lr,
        eval_every=4,
        batch_size=16,
    )
    assert set(res.changed) == EXPECTED[attacker]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit-identical
    assert torch.equal(torch.random.get_rng_state(), rng)  # global random state untouched
    assert res.steps == [0, 4, 8, 12] and len(res.test_acc) == len(res.train_loss) == 4
    assert res.lr == lr and res.sweep[0]["val_area"] is None and res.val_acc == []
    assert res.optimizer == optimizer and res.settings["selection"] == "given"


def test_lora_adapts_every_linear_and_conv_of_the_block_only():
    res = finetune(
        _model(), *_data(), attacker="lora", block="block", steps=3, lr=0.01, rank=2, eval_every=3
    )
    assert res.settings["lora_targets"] == ["block.conv", "block.grouped", "block.fc"]
    assert res.settings["rank"] == 2 and res.changed == ()


def test_lora_on_attention_leaves_the_fused_projection_unchanged():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
            self.out = nn.Linear(6, 4)

        def forward(self, x):
            t = x.reshape(x.shape[0], 6, 6)
            return self.out(self.attn(t, t, t, need_weights=False)[0].mean(1))

    torch.manual_seed(0)
    net = nn.Sequential(collections.OrderedDict(block=Attn()))
    res = finetune(net, *_data(), attacker="lora", block="block", steps=6, lr=0.01, eval_every=3)
    assert res.settings["lora_targets"] == ["block.attn", "block.out"]
    assert res.changed == ()


def test_the_sweep_chooses_on_held_out_data_and_records_the_grid():
    train, test = _data()
    kw = dict(attacker="finetune_all", optimizer="adamw", steps=10, eval_every=5, batch_size=16)
    res = finetune(_model(), train, test, lr_grid=[1e-4, 1e-2, 1e-3], **kw)
    grid = [r["lr"] for r in res.sweep]
    assert grid == res.settings["lr_grid"] == [1e-4, 1e-3, 1e-2]
    areas = [r["val_area"] for r in res.sweep]
    assert res.lr == grid[int(np.argmax(areas))]
    assert res.settings["n_val"] + res.settings["n_train"] == train[1].shape[0]
    assert len(res.val_acc) == len(res.steps)
    # the test data never decide: other test labels give the same choice
    shuffled = (test[0], test[1].flip(0))
    again = finetune(_model(), train, shuffled, lr_grid=[1e-4, 1e-2, 1e-3], **kw)
    assert again.lr == res.lr and again.sweep == res.sweep


def test_default_grids_and_a_learnable_task_is_learned():
    assert set(LR_GRIDS) == {"sgd", "adamw"}
    res = finetune(_model(), *_data(), attacker="finetune_all", steps=40, eval_every=20)
    assert res.settings["lr_grid"] == list(LR_GRIDS["adamw"])
    assert res.test_acc[-1] > 0.8 > res.test_acc[0]


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    kw = dict(attacker="finetune_block", block="block", steps=8, lr=0.01, eval_every=4)
    a, b = (finetune(_model(), *_data(), **kw) for _ in range(2))
    c = finetune(_model(), *_data(), seed=1, **kw)
    assert a == b and a.train_loss != c.train_loss


def test_a_diverging_rate_keeps_its_last_evaluation_and_is_not_chosen():
    res = finetune(
        _model(),
        *_data(),
        attacker="finetune_all",
        optimizer="sgd",
        steps=20,
        lr_grid=[1e-2, 1e6],
        eval_every=5,
        batch_size=16,
    )
    blown = [r for r in res.sweep if r["lr"] == 1e6][0]
    assert blown["diverged_at"] is not None and res.lr == 1e-2
    assert all(math.isfinite(v) for v in res.test_acc + res.test_loss)


def test_weights_that_blow_up_are_never_kept_as_a_checkpoint():
    """An update can make the weights NaN before any mini-batch loss is: the evaluation that
    sees them is divergence, and the curve keeps the last finite evaluation."""
    kw = dict(attacker="finetune_all", optimizer="sgd", steps=12, eval_every=1, batch_size=16)
    res = finetune(_model(), *_data(), lr=1e4, **kw)
    (rec,) = res.sweep
    assert rec["diverged_at"] is not None and 0 <= rec["diverged_at"] <= 12
    assert all(math.isfinite(v) for v in res.test_loss + res.test_acc + res.train_loss)
    k = res.steps.index(rec["diverged_at"]) if rec["diverged_at"] in res.steps else None
    if k:  # the curve is flat from the last good evaluation on
        assert len(set(res.test_acc[k - 1 :])) == 1


def test_lr_with_lr_grid_numpy_scalars_and_integer_inputs():
    kw = dict(attacker="linear_probe", optimizer="sgd", steps=4, eval_every=2)
    with pytest.raises(ValueError, match="not both"):
        finetune(_model(), *_data(), lr=0.1, lr_grid=[0.1, 0.3], **kw)
    res = finetune(_model(), *_data(), lr=np.float32(0.1), **kw)  # a NumPy scalar is a number
    ref = finetune(_model(), *_data(), lr=0.1, **kw)
    assert res.test_acc == ref.test_acc
    assert finetune_deficit(res.test_acc, ref.test_acc, res.steps, chance=np.float32(1 / 3)) == 0
    # integer inputs reach the model as integers (token ids for an embedding)
    emb = nn.Sequential(
        collections.OrderedDict(emb=nn.Embedding(10, 4), flat=nn.Flatten(), block=nn.Linear(8, 6))
    )
    ids = torch.arange(120).reshape(60, 2) % 10
    y = (ids[:, 0] > 4).long()
    out = finetune(emb, (ids[:40], y[:40]), (ids[40:], y[40:]), lr=0.1, **kw)
    assert len(out.test_acc) == 3


def test_deficit_and_steps_to_target_are_as_documented():
    t = [0, 10, 20]
    assert finetune_deficit([0.2, 0.8, 0.9], [0.2, 0.8, 0.9], t, chance=0.2) == 0.0
    assert finetune_deficit([0.2, 0.2, 0.2], [0.2, 0.8, 0.9], t, chance=0.2) == 1.0
    assert finetune_deficit([0.2, 0.9, 1.0], [0.2, 0.8, 0.9], t, chance=0.2) < 0
    # chance 0: the plain ratio of the trapezoid areas
    d = finetune_deficit([0.0, 0.5, 0.5], [0.0, 1.0, 1.0], t)
    assert d == pytest.approx(1 - (2.5 + 5.0) / (5.0 + 10.0))
    assert steps_to_target([0.1, 0.5, 0.95], 1.0, t, 0.9) == 20
    assert steps_to_target([0.1, 0.5, 0.8], 1.0, t, 0.9) is None
    assert steps_to_target([0.1, 0.5, 0.95], 1.0) == 2  # default steps 0, 1, 2


def test_a_result_against_itself_and_its_json():
    res = finetune(_model(), *_data(), attacker="linear_probe", steps=30, lr=0.5, eval_every=10)
    assert res.deficit(res, chance=1 / 3) == 0.0
    assert res.steps_to(res, 0.5) is not None
    js = res.to_json()
    assert js["changed"] == [] and FinetuneResult(**{**js, "changed": ()}) == res


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(attacker="prune"), ValueError, "unknown attacker"),
        (dict(attacker="lora"), ValueError, "needs block="),
        (dict(attacker="lora", block="nope"), ValueError, "no submodule 'nope'"),
        (dict(attacker="lora", block="stem.1"), ValueError, "no Linear, Conv2d"),
        (dict(attacker="linear_probe", optimizer="adam"), ValueError, "unknown optimizer"),
        (dict(attacker="linear_probe", schedule="step"), ValueError, "unknown schedule"),
        (dict(attacker="linear_probe", steps=0), ValueError, "steps must be an integer"),
        (dict(attacker="linear_probe", lr=-1.0), ValueError, "positive finite"),
        (dict(attacker="linear_probe", lr_grid=[]), ValueError, "non-empty"),
        (dict(attacker="linear_probe", val_fraction=1.0), ValueError, "val_fraction"),
        (dict(attacker="linear_probe", n_classes=2), ValueError, "labels must lie"),
    ],
)
def test_bad_arguments_are_typed_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        finetune(_model(), *_data(), **{"steps": 2, "eval_every": 1, **kwargs})


def test_bad_data_and_models_are_typed_errors():
    (X, y), test = _data()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        finetune(lambda x: x, (X, y), test, attacker="linear_probe")
    with pytest.raises(ValueError, match="labels must be integers"):
        finetune(_model(), (X, y.float()), test, attacker="linear_probe")
    X_bad = X.clone()
    X_bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        finetune(_model(), (X_bad, y), test, attacker="linear_probe")
    with pytest.raises(ValueError, match="n labels"):
        finetune(_model(), (X, y[:-1]), test, attacker="linear_probe")
    with pytest.raises(ValueError, match=r"\(n, D\) features"):
        finetune(_model()[0], (X, y), test, attacker="linear_probe")
    for bad in ([0.1, float("nan")], [0.1]), ([0.1, 0.2], [0.1]):
        with pytest.raises(ValueError):
            finetune_deficit(*bad)
    with pytest.raises(ValueError, match="never rises above chance"):
        finetune_deficit([0.1, 0.05], [0.1, 0.1], chance=0.1)
    with pytest.raises(ValueError, match="fraction"):
        steps_to_target([0.1], 1.0, fraction=0.0)


def _skewed(n=400, d=8, seed=0):
    """A frozen linear extractor whose features have a covariance spread over six decades
    (singular values 1 … 1e-3, rotated), the class signal in the smallest direction."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    X = torch.randn(n, d, generator=g)
    X[:, -1] += 1.5 * (2 * y - 1)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    net = nn.Linear(d, d, bias=False)
    with torch.no_grad():
        net.weight.copy_(Q @ torch.diag(torch.logspace(0, -3, d)))
    return net, (X[:300], y[:300]), (X[300:], y[300:])


def test_the_whitened_probe_undoes_a_badly_conditioned_covariance():
    net, train, test = _skewed()
    kw = dict(optimizer="sgd", steps=60, eval_every=5, batch_size=32)
    plain = finetune(net, train, test, attacker="linear_probe", **kw)
    white = finetune(net, train, test, attacker="whitened_probe", **kw)
    reach = [steps_to_target(r.test_acc, 0.9, r.steps, 1.0) for r in (plain, white)]
    assert reach[1] is not None and (reach[0] is None or reach[0] > reach[1])
    assert white.settings["ridge"] > 0 and white.changed == ()


def test_the_closed_form_start_is_already_a_good_head():
    net, train, test = _skewed()
    kw = dict(optimizer="adamw", steps=10, eval_every=5)
    random_head = finetune(net, train, test, attacker="linear_probe", **kw)
    start = finetune(net, train, test, attacker="lstsq_probe", **kw)
    assert start.test_acc[0] > 0.9 > random_head.test_acc[0] + 0.3
    # the start is fit on the training split only: other test labels, the same start
    again = finetune(net, train, (test[0], test[1].flip(0)), attacker="lstsq_probe", **kw)
    assert again.val_acc == start.val_acc and again.lr == start.lr


def test_default_grids_span_three_decades_on_a_log_scale():
    for grid in LR_GRIDS.values():
        ratios = np.diff(np.log10(grid))
        assert grid[-1] / grid[0] >= 1e3 * (1 - 1e-12)
        np.testing.assert_allclose(ratios, ratios[0], rtol=1e-12)


def test_warmup_cosine_is_torchs_schedulers_over_the_budget():
    from condreg.torch._finetune import scheduler

    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1.0)
    sched = scheduler(opt, "warmup_cosine", 20)
    assert isinstance(sched, torch.optim.lr_scheduler.SequentialLR)
    rates = []
    for _ in range(20):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[0] == pytest.approx(0.5) and max(rates) == pytest.approx(1.0) == rates[2]
    assert 0 < rates[-1] < 0.01 and opt.param_groups[0]["lr"] == pytest.approx(0, abs=1e-12)
    assert scheduler(opt, "constant", 20) is None
    kw = dict(attacker="finetune_all", optimizer="sgd", steps=10, lr=0.05, eval_every=5)
    const = finetune(_model(), *_data(), **kw)
    cos = finetune(_model(), *_data(), schedule="warmup_cosine", **kw)
    assert cos.schedule == "warmup_cosine" and cos.train_loss[1:] != const.train_loss[1:]


def test_the_search_extends_a_grid_beyond_its_edge_until_interior_or_capped():
    net, train, test = _skewed()
    kw = dict(attacker="whitened_probe", optimizers=["sgd"], schedules=["constant"], steps=20)
    kw.update(short_steps=20, eval_every=5, batch_size=32, lr_grids={"sgd": [1e-6, 1e-5]})
    res = finetune_search(net, train, test, max_extend=12, **kw)
    rates = [r["lr"] for r in res.sweep]
    assert rates[:2] == [1e-6, 1e-5] and len(rates) > 3
    np.testing.assert_allclose(rates[2:], 1e-5 * 10.0 ** np.arange(1, len(rates) - 1))
    (line,) = res.settings["lines"]
    assert line["stopped"] in ("interior", "diverged") and not res.settings["capped"]
    assert res.lr > 1e-5 and line["extended"] == {"low": 0, "high": len(rates) - 2}
    capped = finetune_search(net, train, test, max_extend=1, **kw)
    assert [r["lr"] for r in capped.sweep] == pytest.approx([1e-6, 1e-5, 1e-4])
    assert capped.settings["capped"] and capped.settings["chosen_at_grid_edge"]
    assert capped.settings["lines"][0]["capped"] and capped.lr == pytest.approx(1e-4)


def test_successive_halving_runs_every_configuration_short_and_the_best_few_in_full():
    train, test = _data()
    kw = dict(attacker="finetune_all", steps=12, short_steps=4, keep=2, eval_every=4)
    kw.update(batch_size=16, lr_grids={"sgd": [1e-3, 1e-2, 1e-1], "adamw": [1e-4, 1e-3, 1e-2]})
    res = finetune_search(_model(), train, test, **kw)
    budgets = [r["steps"] for r in res.sweep]
    first_full = budgets.index(12)
    assert set(budgets[:first_full]) == {4} and set(budgets[first_full:]) == {12}
    short = res.sweep[:first_full]
    assert first_full >= 2 * 2 * 3  # every optimizer × schedule × rate, and any extensions
    assert {(r["optimizer"], r["schedule"]) for r in short} == {
        (o, s) for o in ("sgd", "adamw") for s in ("constant", "warmup_cosine")
    }
    key = lambda r: (r["val_area"], r["val_final"], -r["lr"])  # noqa: E731
    promoted = sorted(short, key=key, reverse=True)[:2]
    full = res.sweep[first_full:]
    assert [(r["optimizer"], r["schedule"], r["lr"]) for r in full[:2]] == [
        (r["optimizer"], r["schedule"], r["lr"]) for r in promoted
    ]
    best = max(full, key=key)
    assert (res.optimizer, res.schedule, res.lr) == (
        best["optimizer"],
        best["schedule"],
        best["lr"],
    )
    assert res.steps == [0, 4, 8, 12] and res.settings["keep"] == 2
    assert all(isinstance(line["at_edge"], bool) for line in res.settings["lines"])
    # the test data never decide
    again = finetune_search(_model(), train, (test[0], test[1].flip(0)), **kw)
    assert again.sweep == res.sweep and again.lr == res.lr


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(schedules=["cyclic"]), "unknown schedule"),
        (dict(optimizers=[]), "non-empty"),
        (dict(optimizers=["adam"]), "unknown optimizer"),
        (dict(short_steps=9), "at most steps"),
        (dict(keep=0), "keep must"),
        (dict(max_extend=-1), "max_extend must"),
        (dict(lr_grids={"sgd": [0.1]}), "lr_grids needs"),
        (dict(lr_grids={"sgd": [0.1], "adamw": []}), "non-empty"),
    ],
)
def test_bad_search_arguments_are_typed_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        finetune_search(_model(), *_data(), attacker="linear_probe", steps=8, **kwargs)


def test_a_line_that_learns_nothing_climbs_until_a_rate_diverges():
    res = finetune_search(
        _model(),
        *_data(),
        attacker="finetune_all",
        optimizers=["sgd"],
        schedules=["constant"],
        lr_grids={"sgd": [1e-3, 1e-2]},
        steps=20,
        short_steps=20,
        eval_every=5,
        batch_size=16,
        max_extend=12,
    )
    (line,) = res.settings["lines"]
    rates = [r["lr"] for r in res.sweep]
    np.testing.assert_allclose(rates, 1e-3 * 10.0 ** np.arange(len(rates)))
    assert res.sweep[-1]["diverged_at"] is not None
    assert all(r["diverged_at"] is None for r in res.sweep[:-1])
    # 20 steps learn nothing here (every rate at chance): the line climbs, and stops where a rate
    # diverges, well before the cap
    assert len({(r["val_area"], r["val_final"]) for r in res.sweep}) == 1
    assert line["stopped"] == "diverged" and not line["capped"] and line["at_edge"]
