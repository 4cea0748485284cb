"""condreg.torch.hf: Algorithm 1 in a real transformers.Trainer on a tiny BERT (no download)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import condreg  # noqa: E402


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, ids, labels=None):
        self.ids, self.labels = ids, labels

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        item = {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i])}
        if self.labels is not None:
            item["labels"] = self.labels[i]
        return item


def _data():
    gen = torch.Generator().manual_seed(0)
    ids_p = torch.randint(0, 16, (48, 6), generator=gen)
    ids_h = torch.randint(16, 32, (48, 6), generator=gen)
    return ids_p, (ids_p[:, 1] > 7).long(), ids_h


IMMUNIZED = "bert.encoder.layer.0.attention.self.query"


def _immunized(model):
    return model.bert.encoder.layer[0].attention.self.query


def _model():
    """A 1-layer BERT from a config, float64. Only the immunized map (the query projection,
    bias fixed at 0: F = zθ per token) and the classifier train, so the map's inputs z (the
    embedding LayerNorm's output, rank D − 1: a pseudo-inverse case) stay fixed."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=8,
        num_labels=2,
        hidden_dropout_prob=0.0,  # deterministic: the step can be compared with a reference
        attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertForSequenceClassification(cfg).double()
    for p in model.bert.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        _immunized(model).bias.zero_()
        _immunized(model).weight.copy_(torch.eye(16, dtype=torch.float64))  # θ_0 = I
    _immunized(model).weight.requires_grad_(True)
    return model


def _inputs_of(model, ids):
    """The immunized map's inputs z, one row per token."""
    captured = []
    hook = _immunized(model).register_forward_hook(lambda m, i, o: captured.append(i[0]))
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    hook.remove()
    return captured[0].reshape(-1, 16).numpy()


def _theta(model):
    return _immunized(model).weight.detach().T.numpy().copy()


def _train(tmp_path, steps, lr=1e-2, **kw):
    from condreg.torch.hf import ImmunizationTrainer

    ids_p, y, ids_h = _data()
    model = _model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=48,
        learning_rate=lr,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1e9,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = ImmunizationTrainer(
        model=model,
        args=args,
        train_dataset=_Tokens(ids_p, y),
        harmful_dataset=_Tokens(ids_h),
        immunized=IMMUNIZED,
        **kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return trainer, model


def test_one_trainer_step_is_algorithm1s_update(tmp_path):
    """ridge=0, normalize=False, plain SGD: the immunized weight moves by −η(∇L + K⁺-left
    preconditioned regularizer gradient), θ = weight.T."""
    from condreg.algorithm import preconditioned_gradient

    ids_p, y, ids_h = _data()
    ref = _model()
    theta0 = _theta(ref)
    z_p, z_h = _inputs_of(ref, ids_p), _inputs_of(ref, ids_h)
    ref.train()
    ref.zero_grad()
    ref(input_ids=ids_p, attention_mask=torch.ones_like(ids_p), labels=y).loss.backward()
    task_grad = _immunized(ref).weight.grad.T.numpy()
    trainer, model = _train(tmp_path, 1, lr=1e-3, lam_p=0.5, lam_h=0.2, ridge=0.0, normalize=False)
    theta1 = _theta(model)
    reg = 0.5 * preconditioned_gradient(theta0, z_p, "r_well") + 0.2 * preconditioned_gradient(
        theta0, z_h, "r_ill"
    )
    np.testing.assert_allclose(theta1, theta0 - 1e-3 * (task_grad + reg), rtol=1e-7, atol=1e-10)
    # evaluation uses the model's own loss (no hook capture, no harmful batch)
    metrics = trainer.evaluate(_Tokens(ids_p, y))
    assert np.isfinite(metrics["eval_loss"])


def test_each_term_moves_kappa_the_intended_way(tmp_path):
    """R_ill alone raises κ(H_H), R_well alone lowers κ(H_P) (θ_0 = I: from κ(K_H), κ(K_P)).
    (Both token sets share one embedding table, so their covariances are alike and the combined
    RIR stays small here; the Lightning test shows the joint effect.)"""
    ill_trainer, ill = _train(tmp_path / "ill", 10, lam_p=0.0, lam_h=30.0)
    _, well = _train(tmp_path / "well", 10, lam_p=3e4, lam_h=0.0)
    ids_p, _, ids_h = _data()
    z_p, z_h = _inputs_of(ill, ids_p), _inputs_of(ill, ids_h)
    r_ill = condreg.metrics.rir(_theta(ill), z_p, z_h)
    r_well = condreg.metrics.rir(_theta(well), z_p, z_h)
    assert r_ill.kappa_hh > 2 * r_ill.kappa_kh, r_ill
    assert r_well.kappa_hp < 0.7 * r_well.kappa_kp, r_well
    task, reg = ill_trainer.last_terms
    assert np.isfinite(task) and reg > 0
    assert not list(tmp_path.glob("**/*.safetensors"))


def test_bad_immunized_name(tmp_path):
    from condreg.torch.hf import ImmunizationTrainer

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="no module named"):
        ImmunizationTrainer(
            model=_model(), args=args, harmful_dataset=_Tokens(_data()[2]), immunized="nope"
        )


def test_a_batch_without_labels_names_the_expected_keys(tmp_path):
    from condreg.torch.hf import ImmunizationTrainer

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    ids_p, _, ids_h = _data()
    model = _model()
    trainer = ImmunizationTrainer(
        model=model, args=args, harmful_dataset=_Tokens(ids_h), immunized=IMMUNIZED
    )
    model.train()
    batch = {"input_ids": ids_p[:4], "attention_mask": torch.ones_like(ids_p[:4])}
    with pytest.raises(
        ValueError, match=r"needs 'labels'.*got keys \['attention_mask', 'input_ids'\]"
    ):
        trainer.compute_loss(model, batch)
    with pytest.raises(TypeError, match="mapping"):
        trainer.compute_loss(model, [ids_p[:4]])
