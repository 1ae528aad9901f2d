"""bootens_core.exact.theory: Hessian traces, the terms of Theorems 1-2, Lemma 1, particle scores and the exact KL
rates of linear ensembles, against closed forms, finite differences, scipy and particle simulations
(statistical tolerances are multiples of the Monte-Carlo standard error, never tuned)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bootens_core import ensemble, metrics, models, perturb
from bootens_core.exact import linear, theory

NOISE_VAR, PRIOR_VAR = 0.3, 0.7  # not 1, so that a swapped or dropped variance shows
Z = 4.0  # statistical checks: |estimate - truth| < Z standard errors
Z_MANY = 5.0  # for a family of ~200 simultaneous comparisons (P(|z| > 5) = 6e-7 each)


def _flat(params):
    return np.asarray(models.ravel(params)[0])


def _numpy_fn(fn):
    """Compile a scalar JAX function of a vector once, and call it on float64 numpy vectors."""
    jitted = jax.jit(fn)
    return lambda t: float(jitted(jnp.asarray(t, jnp.float64)))


def _fd_grad(fn, theta, eps=1e-6):
    """Central finite-difference gradient of a scalar function of a vector."""
    fn = _numpy_fn(fn)
    out = np.empty_like(theta)
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = eps
        out[j] = (fn(theta + e) - fn(theta - e)) / (2 * eps)
    return out


def _fd_hess_trace(fn, theta, eps=1e-4):
    """Sum of central second differences along the coordinate axes."""
    fn = _numpy_fn(fn)
    f0 = fn(theta)
    total = 0.0
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = eps
        total += (fn(theta + e) - 2 * f0 + fn(theta - e)) / eps**2
    return total


# --- Hessian traces ------------------------------------------------------------------------------------


def test_hessian_trace_exact_on_quadratic():
    rng = np.random.default_rng(0)
    m = 7
    B = rng.normal(size=(m, m))
    Q = B + B.T
    c = rng.normal(size=m)
    fn = lambda t: 0.5 * t @ jnp.asarray(Q) @ t + jnp.asarray(c) @ t + jnp.sum(t) ** 2
    want = np.trace(Q) + 2 * m  # Hess of (sum t)^2 is 2 * ones
    theta = jnp.asarray(rng.normal(size=m))
    for method in ("exact", "auto"):
        tr, se = theory.hessian_trace(jax.random.key(0), fn, theta, method=method)
        assert float(tr) == pytest.approx(want, rel=1e-12, abs=1e-12) and float(se) == 0.0


def test_hutchinson_is_exact_for_a_diagonal_hessian():
    """Rademacher probes: v^T H v = tr H for every probe when H is diagonal, so the estimate has no error."""
    d = jnp.asarray(np.random.default_rng(1).normal(size=9))
    tr, se = theory.hessian_trace(
        jax.random.key(1),
        lambda t: 0.5 * jnp.sum(d * t**2) + jnp.sum(jnp.sin(t[:1])),
        jnp.zeros(9),
        method="hutchinson",
        n_probes=8,
    )
    assert float(tr) == pytest.approx(float(jnp.sum(d)), rel=1e-12) and float(se) == pytest.approx(
        0.0, abs=1e-12
    )


@pytest.fixture(scope="module")
def tanh_net():
    """A tanh MLP 2-6-5-1 (m = 54) and a scalar log joint of it, with its exact Hessian from jax.hessian."""
    model = models.mlp(2, (6, 5), "tanh", weight_var=1.5, bias_var=0.4)
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(9, 2)))
    y = jnp.asarray(rng.normal(size=9))
    params = models.prior_sample(jax.random.key(3), model)
    theta, unravel = models.ravel(params)

    def fn(t):
        return perturb.log_joint(model, unravel(t), x, y, 0.2)

    H = np.asarray(jax.jit(jax.hessian(fn))(theta))
    return fn, theta, H


def test_hessian_trace_exact_matches_full_hessian(tanh_net):
    fn, theta, H = tanh_net
    assert theta.shape[0] > 50
    tr, se = jax.jit(lambda t: theory.hessian_trace(jax.random.key(0), fn, t, method="exact"))(theta)
    assert float(tr) == pytest.approx(np.trace(H), rel=1e-10)
    assert float(se) == 0.0
    # auto switches to Hutchinson above exact_max_dim
    _, se_auto = jax.jit(lambda t: theory.hessian_trace(jax.random.key(0), fn, t, exact_max_dim=10))(theta)
    assert float(se_auto) > 0


def test_hutchinson_against_exact_and_its_variance(tanh_net):
    """Hutchinson is unbiased within its se, the se is calibrated, and shrinks like 1 / sqrt(n_probes).

    For Rademacher probes the per-probe variance is 2 sum_{i != j} H_ij^2 exactly.
    """
    fn, theta, H = tanh_net
    exact = np.trace(H)
    var1 = 2 * (np.sum(H**2) - np.sum(np.diag(H) ** 2))
    reps = 200
    keys = jax.random.split(jax.random.key(6), reps)
    out = {}
    for n in (16, 64):
        f = jax.jit(
            jax.vmap(lambda k, n=n: theory.hessian_trace(k, fn, theta, method="hutchinson", n_probes=n))
        )
        tr, se = (np.asarray(a) for a in f(keys))
        out[n] = se
        assert abs(tr[0] - exact) < Z * se[0]  # a single estimate, within its own se
        z = (tr - exact) / se
        # Mean of the estimates across independent repetitions: unbiased.
        assert abs(tr.mean() - exact) < Z * tr.std(ddof=1) / np.sqrt(reps)
        # se^2 * n estimates the per-probe variance; its mean over repetitions matches the closed form.
        v = se**2 * n
        assert abs(v.mean() - var1) < Z * v.std(ddof=1) / np.sqrt(reps)
        # z-scores have unit spread (t-distribution with n - 1 dof: sd sqrt((n-1)/(n-3))).
        assert np.std(z) == pytest.approx(np.sqrt((n - 1) / (n - 3)), rel=0.2)
    ratio = out[16].mean() / out[64].mean()
    assert ratio == pytest.approx(2.0, rel=0.1)  # sqrt(64 / 16); se means known to ~2% each


def test_hessian_trace_errors():
    fn = lambda t: jnp.sum(t**2)
    with pytest.raises(ValueError, match="unknown method"):
        theory.hessian_trace(jax.random.key(0), fn, jnp.ones(3), method="lanczos")
    with pytest.raises(ValueError, match="n_probes"):
        theory.hessian_trace(jax.random.key(0), fn, jnp.ones(3), method="hutchinson", n_probes=1)
    with pytest.raises(ValueError, match="flat vector"):
        theory.hessian_trace(jax.random.key(0), fn, jnp.ones((2, 3)))


# --- particle terms ------------------------------------------------------------------------------------


def _net_problem(activation, hidden=(5, 4), n=11, k=4, seed=0, noise_var=0.2):
    """A 1-5-4-1 MLP (m = 39) with weights N(0, 2 / fan_in); the same shapes everywhere, so compiled
    programs are shared between tests through the session's compilation cache."""
    model = models.mlp(1, hidden, activation, weight_var=2.0, bias_var=0.5, scale_by_fan_in=True)
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.uniform(-2, 2, size=n))
    y = jnp.asarray(np.sin(2 * np.asarray(x)) + 0.3 * rng.normal(size=n))

    # Prior draws with numpy (no compilation): leaves N(0, prior_var) with a leading particle axis.
    def draw(shapes, variances):
        return jax.tree.map(
            lambda sh, v: jnp.asarray(np.sqrt(v) * rng.normal(size=(k, *sh))),
            shapes,
            variances,
            is_leaf=lambda z: isinstance(z, tuple),
        )

    params = draw(model.shapes, model.prior_var)
    pert = perturb.Perturbation(
        y=y[None] + np.sqrt(noise_var) * jnp.asarray(rng.normal(size=(k, n))),
        anchor=draw(model.shapes, model.prior_var),
    )
    return model, x, y, params, pert, noise_var


@pytest.mark.slow
def test_curvature_is_zero_for_relu_networks():
    """A ReLU net is piecewise linear in every single weight: zero Hessian diagonal away from kinks."""
    model, x, y, params, pert, nv = _net_problem("relu")
    terms = theory.particle_terms(jax.random.key(1), model, params, x, y, pert, nv, method="exact")
    assert np.all(np.abs(terms.curvature) <= 1e-12)
    assert np.all(terms.grad_f_sq > 0)
    # The off-diagonal second derivatives are not zero: Hutchinson on the same term is noisy around 0.
    hut = theory.particle_terms(
        jax.random.key(1), model, params, x, y, pert, nv, method="hutchinson", n_probes=64
    )
    assert np.all(hut.curvature_se > 0)
    assert abs(hut.curvature.mean()) < Z * np.sqrt(np.sum(hut.curvature_se**2)) / hut.curvature.size


def test_curvature_tanh_matches_finite_differences():
    model, x, y, params, pert, nv = _net_problem("tanh", seed=1)
    terms = theory.particle_terms(jax.random.key(1), model, params, x, y, pert, nv, method="exact")
    assert np.all(np.abs(terms.curvature) > 1e-3)
    for i in range(2):
        theta, unravel = models.ravel(jax.tree.map(lambda a, i=i: a[i], params))
        f0 = np.asarray(model.apply(unravel(theta), x))
        c = (f0 - np.asarray(y)) / nv
        want = _fd_hess_trace(
            lambda t, c=c, u=unravel: jnp.asarray(c) @ model.apply(u(t), x), np.asarray(theta)
        )
        assert terms.curvature[i] == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_particle_terms_linear_model_against_hand_formulas():
    rng = np.random.default_rng(3)
    n, D, k = 7, 5, 4
    Phi = rng.normal(size=(n, D))
    y = Phi @ rng.normal(size=D) + rng.normal(size=n)
    model = models.linear_in_features(lambda x: x, D, prior_var=PRIOR_VAR)
    W = rng.normal(size=(k, D))
    pert = perturb.sample(jax.random.key(4), model, jnp.asarray(y), NOISE_VAR, k)
    terms = theory.particle_terms(jax.random.key(5), model, {"w": jnp.asarray(W)}, Phi, y, pert, NOISE_VAR)
    yt, anchor = np.asarray(pert.y), np.asarray(pert.anchor["w"])
    gp = (y - W @ Phi.T) @ Phi / NOISE_VAR - W / PRIOR_VAR
    gpt = (yt - W @ Phi.T) @ Phi / NOISE_VAR - (W - anchor) / PRIOR_VAR
    np.testing.assert_allclose(terms.grad_logp, gp, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(terms.grad_logp_tilde, gpt, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(terms.inner, np.sum(gp * gpt, 1), rtol=1e-12)
    np.testing.assert_allclose(terms.grad_sq, np.sum(gp**2, 1), rtol=1e-12)
    np.testing.assert_allclose(terms.grad_tilde_sq, np.sum(gpt**2, 1), rtol=1e-12)
    A = Phi.T @ Phi / NOISE_VAR + np.eye(D) / PRIOR_VAR
    np.testing.assert_allclose(terms.trace, -np.trace(A), rtol=1e-12)
    np.testing.assert_allclose(terms.grad_f_sq, np.sum(Phi**2) / NOISE_VAR, rtol=1e-12)
    assert terms.prior_trace == pytest.approx(D / PRIOR_VAR, rel=1e-14)
    np.testing.assert_allclose(terms.curvature, 0.0, atol=1e-12)
    np.testing.assert_array_equal(terms.trace_se, 0.0)


def _tanh_terms(hidden: tuple[int, ...], weight_var: float, bias_var: float, seed: int, n: int, k: int):
    """A small tanh net (per-point noise, per-leaf priors), k particles, and their exact particle terms."""
    model = models.mlp(1, hidden, "tanh", weight_var=weight_var, bias_var=bias_var)
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.uniform(-2, 2, size=n))
    y = jnp.asarray(rng.normal(size=n))
    nv = jnp.asarray(rng.uniform(0.1, 0.5, size=n))
    params = models.prior_sample(jax.random.key(seed + 3), model, k)
    pert = perturb.sample(jax.random.key(seed + 4), model, y, nv, k)
    terms = theory.particle_terms(jax.random.key(seed + 5), model, params, x, y, pert, nv, method="exact")
    return model, x, y, nv, params, pert, terms


def test_particle_terms_tanh_against_finite_differences():
    """Gradients, traces and gradient norms of a tiny tanh net with per-point noise and per-leaf priors."""
    k = 2
    model, x, y, nv, params, pert, terms = _tanh_terms((3,), 1.3, 0.4, seed=4, n=6, k=k)
    assert terms.prior_trace == pytest.approx(3 / 1.3 + 3 / 0.4 + 3 / 1.3 + 1 / 0.4, rel=1e-14)
    for i in range(k):
        p_i = jax.tree.map(lambda a, i=i: a[i], params)
        pert_i = jax.tree.map(lambda a, i=i: a[i], pert)
        theta, unravel = models.ravel(p_i)
        th = np.asarray(theta)

        def lp(t, u=unravel):
            return perturb.log_joint(model, u(t), x, y, nv)

        def lpt(t, u=unravel, pert_i=pert_i):
            return perturb.perturbed_log_joint(model, u(t), x, pert_i, nv)

        gp, gpt = _fd_grad(lp, th), _fd_grad(lpt, th)
        np.testing.assert_allclose(terms.grad_logp[i], gp, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(terms.grad_logp_tilde[i], gpt, rtol=1e-6, atol=1e-6)
        assert terms.inner[i] == pytest.approx(gp @ gpt, rel=1e-6)
        assert terms.trace[i] == pytest.approx(_fd_hess_trace(lpt, th), rel=1e-5)
        f = jax.jit(lambda t, u=unravel: model.apply(u(t), x))
        eye = 1e-6 * np.eye(th.size)
        jac = np.stack([(np.asarray(f(th + e)) - np.asarray(f(th - e))) / 2e-6 for e in eye], 1)  # (n, m)
        assert terms.grad_f_sq[i] == pytest.approx(np.sum(jac**2 / np.asarray(nv)[:, None]), rel=1e-6)
        # tr Hess log p = -(grad_f_sq + prior_trace + curvature), the expansion used by Theorem 2.
        assert -(terms.grad_f_sq[i] + terms.prior_trace + terms.curvature[i]) == pytest.approx(
            _fd_hess_trace(lp, th), rel=1e-5
        )


def test_particle_terms_exact_traces_equal_the_full_hessians():
    """The exact traces (assembled from per-point second derivatives of f) against the traces of jax.hessian's
    matrices of log p~ and of the curvature term: two hidden layers, per-point noise, per-leaf priors."""
    k = 3
    model, x, y, nv, params, pert, terms = _tanh_terms((4, 3), 1.7, 0.6, seed=11, n=5, k=k)
    np.testing.assert_array_equal(terms.trace_se, 0.0)
    np.testing.assert_array_equal(terms.curvature_se, 0.0)
    _, unravel = models.ravel(jax.tree.map(lambda a: a[0], params))
    # One compiled Hessian each, taking the particle's point, replicate and residual weights as arguments.
    tr_tilde = jax.jit(lambda t, p: jnp.trace(jax.hessian(
        lambda s: perturb.perturbed_log_joint(model, unravel(s), x, p, nv))(t)))
    tr_curv = jax.jit(lambda t, c: jnp.trace(jax.hessian(
        lambda s: jnp.dot(c, model.apply(unravel(s), x)))(t)))
    for i in range(k):
        theta, _ = models.ravel(jax.tree.map(lambda a, i=i: a[i], params))
        c = (model.apply(unravel(theta), x) - y) / nv
        pert_i = jax.tree.map(lambda a, i=i: a[i], pert)
        assert terms.trace[i] == pytest.approx(float(tr_tilde(theta, pert_i)), rel=1e-11)
        assert terms.curvature[i] == pytest.approx(float(tr_curv(theta, c)), rel=1e-11, abs=1e-12)


def test_particle_terms_errors():
    model, x, y, params, pert, nv = _net_problem("tanh", seed=2)
    key = jax.random.key(0)
    short = jax.tree.map(lambda a: a[:3], pert)
    with pytest.raises(ValueError, match="matching params"):
        theory.particle_terms(key, model, params, x, y, short, nv)
    with pytest.raises(ValueError, match="rows but y has"):
        theory.particle_terms(key, model, params, x[:-1], y, pert, nv)
    with pytest.raises(ValueError, match="labels per particle"):
        theory.particle_terms(key, model, params, x[:-1], y[:-1], pert, nv)
    with pytest.raises(ValueError, match="unknown method"):
        theory.particle_terms(key, model, params, x, y, pert, nv, method="diag")
    with pytest.raises(ValueError, match="n_probes"):
        theory.particle_terms(key, model, params, x, y, pert, nv, n_probes=1)
    with pytest.raises(ValueError, match="anchor"):
        theory.particle_terms(
            key, model, params, x, y, pert._replace(anchor=jax.tree.map(lambda a: a[:3], pert.anchor)), nv
        )


# --- Theorems 1 and 2 ----------------------------------------------------------------------------------


def _synthetic_terms():
    rng = np.random.default_rng(5)
    k = 50
    return theory.ParticleTerms(
        inner=rng.normal(2.0, 1.0, k),
        trace=rng.normal(-3.0, 0.5, k),
        trace_se=np.full(k, 0.2),
        grad_sq=rng.gamma(2.0, 2.0, k),
        grad_tilde_sq=rng.gamma(3.0, 2.0, k),
        grad_f_sq=rng.gamma(1.0, 1.0, k),
        prior_trace=1.5,
        curvature=rng.normal(0.1, 1.0, k),
        curvature_se=np.zeros(k),
        grad_logp=rng.normal(size=(k, 3)),
        grad_logp_tilde=rng.normal(size=(k, 3)),
    )


def test_theorem1_and_theorem2_summaries():
    t = _synthetic_terms()
    k = t.inner.size
    t1 = theory.theorem1(t)
    assert t1["lhs"] == pytest.approx(t.inner.mean()) and t1["rhs"] == pytest.approx(-t.trace.mean())
    assert t1["rate"] == pytest.approx(-(t.inner.mean() + t.trace.mean()))
    assert t1["rate_se"] == pytest.approx(np.std(t.inner + t.trace, ddof=1) / np.sqrt(k))
    assert t1["lhs_se"] == pytest.approx(np.std(t.inner, ddof=1) / np.sqrt(k))
    assert t1["rhs_se_hutchinson"] == pytest.approx(0.2 / np.sqrt(k))
    assert t1["holds"] == (t1["lhs"] >= t1["rhs"]) and t1["holds"] == (t1["rate"] <= 0)
    t2 = theory.theorem2(t)
    assert t2["paper_lhs"] == pytest.approx(t.grad_tilde_sq.mean())
    assert t2["paper_rhs"] == pytest.approx(t.curvature.mean())
    assert t2["corrected_lhs"] == pytest.approx(t.grad_sq.mean())
    assert t2["corrected_rhs"] == pytest.approx(t.grad_f_sq.mean() + 1.5 + t.curvature.mean())
    assert t2["corrected_rate"] == pytest.approx(t2["corrected_rhs"] - t2["corrected_lhs"])
    assert t2["paper_holds"] == (t2["paper_lhs"] >= t2["paper_rhs"])
    assert t2["corrected_holds"] == (t2["corrected_lhs"] >= t2["corrected_rhs"])
    assert all(isinstance(v, (float, bool)) for v in (*t1.values(), *t2.values()))


# --- Lemma 1 -------------------------------------------------------------------------------------------


def test_lemma1_one_weight_no_data_analytic():
    """m = 1, no data, prior N(0, a^2): ||grad log p~||^2 = (theta - theta~)^2 / a^4, of mean
    (theta^2 + a^2) / a^4."""
    a2, w = 2.0, 0.5
    model = models.scalar_linear(prior_var=a2)
    chk = theory.lemma1_check(
        jax.random.key(0), model, {"w": jnp.array([w])}, jnp.zeros(0), jnp.zeros(0), 0.1, 4000
    )
    assert chk.grad_sq == pytest.approx(w**2 / a2**2, rel=1e-14)
    assert chk.correction == pytest.approx(1 / a2, rel=1e-14)
    assert chk.corrected_prediction == pytest.approx((w**2 + a2) / a2**2, rel=1e-14)
    # The paper's form predicts a negative mean of a square here.
    assert chk.paper_prediction == pytest.approx((w**2 - a2) / a2**2, rel=1e-14) and chk.paper_prediction < 0
    assert abs(chk.z_corrected) < Z
    assert chk.z_paper > 20


def test_lemma1_tiny_mlp_corrected_holds_paper_rejected():
    model, x, y, params, pert, nv = _net_problem("tanh", seed=6)
    one = jax.tree.map(lambda a: a[0], params)
    chk = theory.lemma1_check(jax.random.key(11), model, one, x, y, nv, n_perturbations=4000)
    assert abs(chk.z_corrected) < Z
    # The paper's prediction is off by twice the correction: z_paper = 2 correction / se.
    assert chk.z_paper == pytest.approx(2 * chk.correction / chk.mc_se, abs=Z)
    assert chk.z_paper > 5 * Z  # rejected far beyond chance (z = 30 here)
    assert chk.mc_mean == pytest.approx(chk.corrected_prediction, abs=Z * chk.mc_se)
    # Consistent with particle_terms at the same point.
    terms = theory.particle_terms(jax.random.key(0), model, params, x, y, pert, nv)
    assert chk.grad_sq == pytest.approx(float(terms.grad_sq[0]), rel=1e-12)
    assert chk.correction == pytest.approx(float(terms.grad_f_sq[0] + terms.prior_trace), rel=1e-12)
    with pytest.raises(ValueError, match="ONE particle"):
        theory.lemma1_check(jax.random.key(0), model, params, x, y, nv)


# --- scores ----------------------------------------------------------------------------------------------


def test_gaussian_score_formula_and_errors():
    rng = np.random.default_rng(7)
    p = rng.normal(size=(40, 3)) @ rng.normal(size=(3, 3))
    want = -(p - p.mean(0)) @ np.linalg.inv(np.cov(p, rowvar=False))
    np.testing.assert_allclose(theory.gaussian_score(p), want, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="more than m"):
        theory.gaussian_score(p[:4])
    with pytest.raises(ValueError, match=r"\(k, m\)"):
        theory.gaussian_score(p[0])


def test_kde_score_is_the_gradient_of_scipys_kde():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(300, 2)) @ np.array([[1.0, 0.4], [0.0, 0.6]])
    eps = 1e-5

    def num_grad(kde, pts):
        return np.stack(
            [(kde.logpdf((pts + eps * e).T) - kde.logpdf((pts - eps * e).T)) / (2 * eps) for e in np.eye(2)],
            1,
        )

    full = stats.gaussian_kde(x.T)  # Scott's factor by default
    np.testing.assert_allclose(
        theory.kde_score(x, leave_one_out=False), num_grad(full, x), rtol=1e-6, atol=1e-7
    )
    # Leave-one-out: the score at particle i of the KDE of the others, same kernel covariance H (direct sum).
    loo = theory.kde_score(x)
    Hinv = np.linalg.inv(full.covariance)
    for i in (0, 17, 299):
        diff = np.delete(x, i, 0) - x[i]
        w = np.exp(-0.5 * np.sum(diff @ Hinv * diff, 1))
        np.testing.assert_allclose(loo[i], (w / w.sum()) @ diff @ Hinv, rtol=1e-9, atol=1e-12)
    bw = theory.kde_score(x, bandwidth=0.3, leave_one_out=False)
    np.testing.assert_allclose(bw, num_grad(stats.gaussian_kde(x.T, bw_method=0.3), x), rtol=1e-6, atol=1e-7)


def test_kde_score_against_the_analytic_gaussian_score():
    """k = 3000 draws of a correlated 2-D Gaussian, 8 independent repetitions.

    Per particle the KDE score is noisy (relative RMS error ~ 25% here), so the test is on the regression
    slope of the KDE score on the analytic score, in the bulk (Mahalanobis radius < 2, where a kernel holds
    hundreds of particles). In the large-k limit the KDE of a Gaussian N(mu, Sigma) is N(mu, (1 + f^2) Sigma)
    (Scott's factor f), so the slope tends to 1 / (1 + f^2); the tolerance is Z standard errors of the
    mean slope over the repetitions. Against the analytic score itself (slope 1) the smoothing bias
    f^2 / (1 + f^2) = 6.5% is added to the tolerance.
    """
    Sig = np.array([[1.0, 0.6], [0.6, 0.5]])
    mu = np.array([0.3, -1.0])
    P = np.linalg.inv(Sig)
    k, reps = 3000, 8
    f2 = k ** (-2 / 6)
    slopes, rel = [], []
    for rep in range(reps):
        x = np.random.default_rng(100 + rep).multivariate_normal(mu, Sig, size=k)
        s = theory.kde_score(x)
        true = -(x - mu) @ P
        bulk = np.sum((x - mu) @ P * (x - mu), 1) < 4
        slopes.append(np.sum(s[bulk] * true[bulk]) / np.sum(true[bulk] ** 2))
        rel.append(np.sqrt(np.sum((s - true)[bulk] ** 2) / np.sum(true[bulk] ** 2)))
    slopes = np.array(slopes)
    se = slopes.std(ddof=1) / np.sqrt(reps)
    assert abs(slopes.mean() - 1 / (1 + f2)) < Z * se
    assert abs(slopes.mean() - 1) < f2 / (1 + f2) + Z * se
    assert np.mean(rel) < 0.5  # pointwise noise, for scale


def test_kl_rate_score_array_and_jackknife_forms():
    rng = np.random.default_rng(9)
    p = rng.normal(size=(200, 2))
    gp, g = rng.normal(size=(200, 2)), rng.normal(size=(200, 2))
    s = theory.gaussian_score(p)
    r, se = theory.kl_rate_score(gp, g, s)
    vals = np.sum(g * (s - gp), 1)
    assert r == pytest.approx(vals.mean()) and se == pytest.approx(vals.std(ddof=1) / np.sqrt(200))
    r2, se2 = theory.kl_rate_score(gp, g, theory.gaussian_score, particles=p)
    assert r2 == pytest.approx(r, rel=1e-12) and se2 > 0
    with pytest.raises(ValueError, match="needs the particles"):
        theory.kl_rate_score(gp, g, theory.gaussian_score)
    with pytest.raises(ValueError, match="shape"):
        theory.kl_rate_score(gp, g[:5], s)
    with pytest.raises(ValueError, match="shape"):
        theory.kl_rate_score(gp, g, s[:, :1])


# --- linear models: exact rates ------------------------------------------------------------------------


class _LinearProblem:
    """D = 6 features, N = 4 points: 4 data directions and 2 directions where prior = posterior."""

    def __init__(self, seed=0, n=4, D=6):
        rng = np.random.default_rng(seed)
        self.n, self.D = n, D
        self.Phi = rng.normal(size=(n, D))
        self.y = self.Phi @ rng.normal(size=D) + np.sqrt(NOISE_VAR) * rng.normal(size=n)
        self.post = linear.posterior(self.Phi, self.y, NOISE_VAR, PRIOR_VAR)
        self.A = self.Phi.T @ self.Phi / NOISE_VAR + np.eye(D) / PRIOR_VAR
        self.m = np.linalg.solve(self.A, self.Phi.T @ self.y / NOISE_VAR)

    def law(self, t, h, perturbed=True):
        """The particle as an affine map of the randomness xi: w_t = c + L xi, with g = cb + Lb xi - A w.

        Perturbed: xi = (y0~ (n), w~ (D)), w_0 = w~, b = Phi^T (y + y0~) / s2 + w~ / a2. Unperturbed:
        xi = w_0 ~ N(0, a2 I), b = Phi^T y / s2. Propagated with full matrices (no eigendecomposition).
        """
        n, D, A = self.n, self.D, self.A
        cb = self.Phi.T @ self.y / NOISE_VAR
        if perturbed:
            L = np.hstack([np.zeros((D, n)), np.eye(D)])
            Lb = np.hstack([self.Phi.T / NOISE_VAR, np.eye(D) / PRIOR_VAR])
            Cxi = np.diag(np.r_[np.full(n, NOISE_VAR), np.full(D, PRIOR_VAR)])
        else:
            L, Lb, Cxi = np.eye(D), np.zeros((D, D)), PRIOR_VAR * np.eye(D)
        c = np.zeros(D)
        for _ in range(t):
            L, c = L + h * (Lb - A @ L), c + h * (cb - A @ c)
        return c, L, Lb, cb, Cxi

    def kl(self, c, L, Cxi):
        return metrics.gaussian_kl(c, L @ Cxi @ L.T, self.m, np.linalg.inv(self.A))


@pytest.fixture(scope="module")
def lin():
    return _LinearProblem()


@pytest.mark.parametrize("perturbed", [True, False], ids=["perturbed", "unperturbed"])
def test_linear_rates_match_finite_differences_of_the_exact_kl(lin, perturbed):
    """rate_exact = d/dh KL of one more step from q_t: the one-step difference quotient converges at O(h)."""
    h = 0.1 / lin.post.lam.max()
    steps = np.array([0, 1, 4, 15])
    rates = theory.linear_rates(lin.post, h, steps, perturbed=perturbed)
    A = lin.A
    for i, t in enumerate(steps):
        c, L, Lb, cb, Cxi = lin.law(int(t), h, perturbed)
        kl0 = lin.kl(c, L, Cxi)
        assert rates.kl[i] == pytest.approx(kl0, rel=1e-9)
        errs = []
        for delta in (2e-4 / lin.post.lam.max(), 1e-4 / lin.post.lam.max()):
            L1, c1 = L + delta * (Lb - A @ L), c + delta * (cb - A @ c)
            errs.append((lin.kl(c1, L1, Cxi) - kl0) / delta - rates.rate_exact[i])
        assert abs(errs[1]) < 1e-3 * max(1.0, abs(rates.rate_exact[i]))
        assert errs[0] / errs[1] == pytest.approx(2.0, rel=0.05)  # first-order error: halves with the step
        # The general Gaussian formula with C = Cov(w_t, e), e = (Lb - A L_0) xi... computed from the law.
        Sigma = L @ Cxi @ L.T
        C = L @ Cxi @ Lb.T  # Cov(w, b) = Cov(w, e): b - A w_bar differs from b by a constant
        d = c - lin.m
        general = (
            -np.trace(A @ A @ Sigma)
            + np.trace(A @ C)
            + np.trace(A)
            - np.trace(np.linalg.solve(Sigma, C))
            - d @ A @ A @ d
        )
        assert rates.rate_exact[i] == pytest.approx(general, rel=1e-8)
        np.testing.assert_allclose(C, np.eye(lin.D) if perturbed else 0.0, atol=1e-12)
        t1 = np.trace(A @ C) - np.trace(A @ A @ Sigma) - d @ A @ A @ d + np.trace(A)
        assert rates.rate_theorem1[i] == pytest.approx(t1, rel=1e-8)
        assert rates.gap[i] == pytest.approx(-np.trace(np.linalg.solve(Sigma, C)), rel=1e-8, abs=1e-12)
        assert rates.rhs_theorem1[i] == pytest.approx(np.trace(A), rel=1e-12)
        assert rates.lhs_theorem1[i] - rates.rhs_theorem1[i] == pytest.approx(
            -rates.rate_theorem1[i], rel=1e-10
        )


def test_linear_rates_kl_matches_gd_population_kl(lin):
    h = 0.5 / lin.post.lam.max()
    steps = np.array([0, 1, 3, 10, 100, 1000])
    rates = theory.linear_rates(lin.post, h, steps)
    want = linear.gd_population_kl(lin.post, linear.gd_population(lin.post, h, steps))
    np.testing.assert_allclose(rates.kl, want, rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(rates.steps, steps)


def test_linear_rates_signs(lin):
    """Perturbed: the exact rate is never positive, Theorem 1's expression turns positive (-> tr A) and the
    gap is -tr(Sigma^-1 C) (-> -tr A). Unperturbed: no gap, and the KL rises once the particles collapse."""
    h = 0.5 / lin.post.lam.max()
    steps = np.arange(0, 3001)
    trA = np.trace(lin.A)
    p = theory.linear_rates(lin.post, h, steps)
    assert np.all(p.rate_exact <= 1e-12)
    assert np.all(np.diff(p.kl) <= 1e-12)  # and the KL itself decreases
    assert p.rate_theorem1[-1] == pytest.approx(trA, rel=1e-6) and p.gap[-1] == pytest.approx(-trA, rel=1e-6)
    assert np.mean(p.rate_theorem1 > 0) > 0.9  # Theorem 1's condition fails almost all the way
    np.testing.assert_allclose(p.rate_exact - p.rate_theorem1, p.gap, rtol=1e-9, atol=1e-9)
    u = theory.linear_rates(lin.post, h, steps[:60], perturbed=False)
    np.testing.assert_array_equal(u.gap, 0.0)
    np.testing.assert_allclose(u.rate_exact, u.rate_theorem1, rtol=1e-12)
    assert u.rate_exact[0] < 0 and np.any(u.rate_exact > 0)
    first_up = np.argmax(u.rate_exact > 0)
    assert np.all(u.rate_exact[first_up:] > 0) and np.all(np.diff(u.kl[first_up:]) > 0)
    # Off the data subspace (lambda = 1 / a^2) unperturbed particles shrink too: rate 1/a2 - S/a2^2 > 0.
    no_data = linear.posterior(np.zeros((1, 3)), np.zeros(1), NOISE_VAR, PRIOR_VAR)
    u0 = theory.linear_rates(no_data, 0.1, [0, 1, 5])
    np.testing.assert_allclose(u0.rate_exact, 0.0, atol=1e-12)  # perturbed: stays at the prior
    np.testing.assert_allclose(u0.rate_theorem1, 3 / PRIOR_VAR)
    u1 = theory.linear_rates(no_data, 0.1, [0, 1, 5], perturbed=False)
    assert u1.rate_exact[0] == pytest.approx(0.0, abs=1e-12) and np.all(u1.rate_exact[1:] > 0)


def test_linear_rates_errors(lin):
    with pytest.raises(ValueError, match="step_size"):
        theory.linear_rates(lin.post, 0.0, [0, 1])
    with pytest.raises(ValueError, match="non-negative"):
        theory.linear_rates(lin.post, 0.1, [-1, 2])


@pytest.mark.slow
def test_particle_simulation_confirms_exact_rate_and_the_gap(lin):
    """Algorithm 1 (plain gradient ascent, k = 4000 particles started at their anchors) on D = 6, N = 4.

    - the particle estimate of the true KL rate, E[g . (grad log q - grad log p)] with the moment-matched
      score, agrees with rate_exact within Z jackknife standard errors at every snapshot;
    - Theorem 1's expression measured on the particles agrees with its expectation rate_theorem1 (Z se);
    - both differ from each other by the gap -tr(Sigma^-1 C), far beyond the errors after a few steps;
    - the measured Cov(theta, e), e = grad log p~ - grad log p, is the identity (finding: C = I).
    """
    post, D = lin.post, lin.D
    h = 0.5 / post.lam.max()
    snaps = (0, 1, 3, 10, 30, 150)
    model = models.linear_in_features(lambda x: x, D, prior_var=PRIOR_VAR)
    res = ensemble.train(
        jax.random.key(21),
        model,
        lin.Phi,
        lin.y,
        noise_var=NOISE_VAR,
        n_particles=4000,
        opt=ensemble.optimizer("sgd", h),
        steps=snaps[-1],
        snapshot_steps=snaps,
    )
    exact = theory.linear_rates(post, h, snaps)
    for i, t in enumerate(snaps):
        params = jax.tree.map(lambda a, i=i: a[i], res.snapshots)
        terms = theory.particle_terms(
            jax.random.key(i), model, params, lin.Phi, lin.y, res.perturbation, NOISE_VAR
        )
        w = np.asarray(params["w"])
        rate, se = theory.kl_rate_score(
            terms.grad_logp, terms.grad_logp_tilde, theory.gaussian_score, particles=w
        )
        assert abs(rate - exact.rate_exact[i]) < Z * se, (t, rate, exact.rate_exact[i], se)
        t1 = theory.theorem1(terms)
        assert abs(t1["rate"] - exact.rate_theorem1[i]) < Z * t1["rate_se"], (t, t1, exact.rate_theorem1[i])
        if t >= 10:  # (Theorem 1's expression turns positive between steps 3 and 10 here)
            assert abs(t1["rate"] - rate) > 10 * np.hypot(se, t1["rate_se"])
            assert t1["rate"] > 0 >= rate - Z * se
        e = terms.grad_logp_tilde - terms.grad_logp
        C = (w - w.mean(0)).T @ (e - e.mean(0)) / (w.shape[0] - 1)
        # An entry of the sample cross-covariance has sd sqrt(Var w_a Var e_b + C_ab^2) / sqrt(k - 1).
        sd = np.sqrt(np.outer(w.var(0), e.var(0)) + C**2) / np.sqrt(w.shape[0] - 1)
        assert np.all(np.abs(C - np.eye(D)) < Z_MANY * sd + 1e-12), (t, C)


@pytest.mark.parametrize("activation, in_dim, hidden", [("tanh", 1, (4, 3)), ("relu", 3, (5,)),
                                                         ("tanh", 2, (3, 2, 3))])
def test_mlp_traces_through_pre_activations_equal_the_traces_along_every_parameter(
        activation, in_dim, hidden):
    """The fully connected networks' per-point traces come through their pre-activations; the same network as
    a model of one's own (no signature) takes the pass along every parameter: the same terms to rounding."""
    model = models.mlp(in_dim, hidden, activation, weight_var=1.7, bias_var=0.6)
    own = model._replace(signature=None)
    rng = np.random.default_rng(5)
    n, k = 6, 3
    x = jnp.asarray(rng.uniform(-2, 2, size=(n, in_dim) if in_dim > 1 else n))
    y = jnp.asarray(rng.normal(size=n))
    nv = jnp.asarray(rng.uniform(0.1, 0.5, size=n))
    params = models.prior_sample(jax.random.key(1), model, k)
    pert = perturb.sample(jax.random.key(2), model, y, nv, k)
    fast, slow = (theory.particle_terms(jax.random.key(3), mdl, params, x, y, pert, nv, method="exact")
                  for mdl in (model, own))
    scale = np.max(np.abs(slow.curvature)) + 1.0
    np.testing.assert_allclose(fast.curvature, slow.curvature, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(fast.trace, slow.trace, rtol=1e-12)
    if activation == "relu":  # piecewise linear: no second derivative along any parameter
        np.testing.assert_array_equal(fast.curvature, 0.0)
    else:
        assert np.all(np.abs(slow.curvature) > 1e-6)
