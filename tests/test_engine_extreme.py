"""The engine's ``"extreme"`` route (condreg._spectrum.plan, condreg._extreme.gram_product), taken
by the PyTorch adapter for a single CPU batch from ``EXTREME_MIN`` on:
``eigvalsh`` of the Gram matrix plus the eigenvectors of the extreme tie sets only, since
``d value / d mu = a·mu + h`` with ``h`` supported on those sets (docs/math.md §10.1). Checked
against the SVD path (float64), the full-eigh path, at ties, near ties (the fallback), in float32
and at extreme scales."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import conditioned_rtol

torch = pytest.importorskip("torch")

from array_api_compat import array_namespace  # noqa: E402

import condreg  # noqa: E402
import condreg.torch  # noqa: E402
from condreg import _extreme, _spectrum  # noqa: E402
from condreg.testing import matrix_with_spectrum  # noqa: E402

QUANTITIES = ["r_ill", "r_well", "condition_number"]
SHAPES = [pytest.param(160, 240, id="N<D"), pytest.param(240, 160, id="N>D")]


@pytest.fixture
def paths(monkeypatch):
    """Counts how the backward assembled ``P``: ``ext`` (extreme clusters) or ``fallback``."""
    seen = {"ext": 0, "fallback": 0}
    original = _extreme.gram_product

    def spy(*args, **kwargs):
        P = original(*args, **kwargs)
        seen["ext" if P is not None else "fallback"] += 1
        return P

    monkeypatch.setattr(_extreme, "gram_product", spy)
    return seen


def _grad(F: torch.Tensor, quantity: str) -> np.ndarray:
    F = F.detach().clone().requires_grad_()
    getattr(condreg, quantity)(F, gram=True).backward()
    return F.grad.double().numpy()


def _full_path_grad(monkeypatch, F, quantity):
    with monkeypatch.context() as m:
        m.setattr(_spectrum, "EXTREME_MIN", 10**9)
        return _grad(F, quantity)


def _svd_reference(F: np.ndarray, quantity: str, **kw) -> np.ndarray:
    F = np.asarray(F, dtype=np.float64)
    options = {"tie_rtol": kw.get("tie_rtol"), "method": "svd", "vectors": True, "gram": True}
    return _spectrum.assemble(_spectrum.evaluate(quantity, F, np, **options), np)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("N", "D"), SHAPES)
def test_extreme_path_is_taken_and_matches_svd_path(paths, quantity, N, D):
    X = np.random.default_rng(N + D).standard_normal((N, D))
    got = _grad(torch.tensor(X), quantity)
    assert paths == {"ext": 1, "fallback": 0}
    assert _rel(got, _svd_reference(X, quantity)) < 1e-12


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_numpy_grad_takes_the_same_route(paths, quantity):
    """One gradient, one way: NumPy's ``*_grad`` takes the extreme route where the PyTorch CPU
    adapter does (the same shape rule), with the same result."""
    N, D = SHAPES[0].values
    X = np.random.default_rng(N + D).standard_normal((N, D))
    got = getattr(condreg, quantity + "_grad")(X, gram=True)
    assert paths == {"ext": 1, "fallback": 0}
    assert _rel(got, _grad(torch.tensor(X), quantity)) < 1e-12
    assert _rel(got, _svd_reference(X, quantity)) < 1e-12


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("N", "D"), SHAPES)
def test_exact_ties_at_both_ends(paths, quantity, N, D):
    """Three tied largest and four tied smallest singular values: the tie sets' subspaces (not
    single vectors) carry the minimum-norm subgradient."""
    n = min(N, D)
    s = np.linspace(3.0, 1.0, n)
    s[:3], s[-4:] = 3.0, 1.0
    X = matrix_with_spectrum(s, N, D, seed=3)
    got = _grad(torch.tensor(X), quantity)
    assert paths == {"ext": 1, "fallback": 0}
    assert _rel(got, _svd_reference(X, quantity)) < 1e-12


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("N", "D"), SHAPES)
def test_float32_matches_float64_reference(paths, quantity, N, D):
    X = np.random.default_rng(7).standard_normal((N, D)).astype(np.float32)
    got = _grad(torch.tensor(X), quantity)
    assert paths["ext"] == 1
    assert _rel(got, _svd_reference(X, quantity)) < 2e-5


@pytest.mark.parametrize("quantity", ["r_ill", "condition_number"])
def test_near_tie_falls_back_to_full_eigh(paths, monkeypatch, quantity):
    """The two smallest singular values 1e-11 apart (not tied, but within ~15 shifts of each
    other, so inverse iteration would converge slowly): the full eigh of the same Gram matrix is
    used."""
    s = np.linspace(2.0, 1.0, 160)
    s[-2] = 1.0 + 1e-11
    X = matrix_with_spectrum(s, 240, 160, seed=5)
    got = _grad(torch.tensor(X), quantity)
    assert paths == {"ext": 0, "fallback": 1}
    # The vectors of values 1e-11 apart are determined to ~eps / 1e-11 only, on every path.
    assert _rel(got, _full_path_grad(monkeypatch, torch.tensor(X), quantity)) < 1e-3
    assert _rel(got, _svd_reference(X, quantity)) < 1e-3


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_same_as_full_eigh_path(monkeypatch, quantity):
    X = torch.tensor(np.random.default_rng(11).standard_normal((300, 200)))
    assert _rel(_grad(X, quantity), _full_path_grad(monkeypatch, X, quantity)) < 1e-12


@pytest.mark.parametrize(
    ("quantity", "power"), [("r_ill", -5), ("r_well", 3), ("condition_number", -1)]
)
@pytest.mark.parametrize("scale", [2.0**-300, 2.0**250])
def test_extreme_scale_is_homogeneous(paths, quantity, power, scale):
    """G(c·F) = c**(2·degree + 1)·G(F): the scale-free assembly carries over (c a power of two,
    so c·F is exact; where c**power over- or underflows the entries are ±inf or 0, not NaN)."""
    X = np.random.default_rng(13).standard_normal((240, 160))
    base = _grad(torch.tensor(X), quantity)
    got = _grad(torch.tensor(X * scale), quantity)
    assert not np.isnan(got).any()
    with np.errstate(over="ignore", under="ignore"):
        want = base * (scale**power if abs(np.log2(scale) * power) < 1000 else np.inf)
    finite = np.isfinite(want) & (np.abs(want) > 1e-290)
    if finite.any():
        assert _rel(got[finite], want[finite]) < 1e-12
    assert paths["ext"] >= 1


def test_gram_cluster_spans_the_cluster_and_refuses_unseparated_ones():
    rng = np.random.default_rng(17)
    Q, _ = np.linalg.qr(rng.standard_normal((150, 150)))
    mu = np.linspace(1.0, 0.1, 150)
    mu[-3:] = 0.1  # a tie set of three at the bottom
    M = torch.tensor((Q * mu) @ Q.T)
    basis = _extreme.gram_cluster(M, torch.tensor(mu), 147, 150, array_namespace(M))
    assert basis is not None and basis.shape == (150, 3)
    want = Q[:, -3:] @ Q[:, -3:].T
    assert np.max(np.abs(basis.numpy() @ basis.numpy().T - want)) < 1e-12
    mu2 = mu.copy()
    mu2[-4] = 0.1 + 1e-12  # the neighbour too close for shift-and-invert to converge quickly
    M2 = torch.tensor((Q * mu2) @ Q.T)
    assert _extreme.gram_cluster(M2, torch.tensor(mu2), 147, 150, array_namespace(M2)) is None


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("N", "D"), [pytest.param(8, 30, id="N<D"), pytest.param(30, 8, id="N>D")])
def test_small_batches_match_the_svd_reference(quantity, dtype, N, D):
    """Below ``EXTREME_MIN`` (the Gram eigh with all vectors, or the exact path): the value and
    gradient of the SVD reference, also at ties at both ends and on the exact (QR/SVD) path."""
    s = np.array([3.0, 3.0, 2.0, 1.5, 1.0, 1.0, 1.0, 0.5])
    cases = [
        matrix_with_spectrum(s, N, D, seed=1),
        matrix_with_spectrum(np.geomspace(1e6, 1, 8), N, D, seed=2),
    ]
    for X in cases:
        F = torch.tensor(X, dtype=getattr(torch, dtype))
        A = F.clone().requires_grad_()
        va = getattr(condreg, quantity)(A, gram=True)
        va.backward()
        assert va.dtype == F.dtype and A.grad.dtype == F.dtype
        Xr = F.double().numpy()
        # ties at the rounding scale of F's dtype (a float32 tie is split by ~1e-7)
        tie = _spectrum.default_tie_rtol(F.shape, np.dtype(dtype), np)
        vkw = {"tie_rtol": tie} if quantity == "r_ill" else {}
        vb = float(getattr(condreg, quantity)(Xr, gram=True, **vkw))
        tol = 1e-12 if dtype == "float64" else 1e-5
        if X is cases[1]:  # κ(F) = 1e6: the exact path, accurate to ~κ(F)·eps
            if dtype == "float32":
                continue  # σ_min ≈ 10·eps·σ_1: not resolved in float32 by any method
            tol = conditioned_rtol(1e6)
        assert abs(float(va.detach()) - vb) <= tol * abs(vb)
        assert _rel(A.grad.double().numpy(), _svd_reference(Xr, quantity, tie_rtol=tie)) < tol
