"""bootens_core.ensemble: Algorithm 1 against closed forms and independent re-implementations.

Most checks use a small model linear in its parameters, ``f(x) = x @ w`` with ``x`` the (n, D) design matrix,
for which everything is known: the perturbed log joint is the quadratic ``-(1/2) w^T A w + b^T w + c`` with
``A = Phi^T Phi / sigma^2 + I / alpha^2`` and ``b = Phi^T y~ / sigma^2 + w~ / alpha^2``, its maximiser is
``linear.perturbed_map``, and plain gradient ascent is ``w <- w + h (b - A w)``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from bootens_core import ensemble, models, perturb
from bootens_core.exact import linear

NOISE_VAR, PRIOR_VAR = 0.5, 1.0


class LinearProblem:
    def __init__(self, n=25, D=4, seed=0):
        rng = np.random.default_rng(seed)
        self.Phi = rng.normal(size=(n, D))
        self.y = self.Phi @ rng.normal(size=D) + np.sqrt(NOISE_VAR) * rng.normal(size=n)
        self.model = models.linear_in_features(lambda x: x, D, prior_var=PRIOR_VAR)
        self.post = linear.posterior(self.Phi, self.y, NOISE_VAR, PRIOR_VAR)
        self.A = self.Phi.T @ self.Phi / NOISE_VAR + np.eye(D) / PRIOR_VAR
        eig = np.linalg.eigvalsh(self.A)
        self.lam_min, self.lam_max = eig[0], eig[-1]
        # Plain gradient ascent: w_t - w* = (I - h A)^t (w_0 - w*), so with h = 1/lambda_max every error
        # contracts at least by rho = 1 - lambda_min / lambda_max per step.
        self.h = 1.0 / self.lam_max
        self.rho = 1.0 - self.lam_min / self.lam_max
        self.steps = math.ceil(np.log(1e-11) / np.log(self.rho))

    def train(self, key, **kwargs):
        """ensemble.train on this problem; keyword arguments override or add to the common ones."""
        return ensemble.train(key, self.model, self.Phi, self.y, **{"noise_var": NOISE_VAR, **kwargs})

    def b(self, pert):
        return np.asarray(pert.y) @ self.Phi / NOISE_VAR + np.asarray(pert.anchor["w"]) / PRIOR_VAR

    def gd_path(self, pert, w0, steps):
        """Independent numpy re-implementation of Algorithm 1's updates, every particle: (steps+1, k, D)."""
        b = self.b(pert)
        w = np.array(w0, float)
        path = [w.copy()]
        for _ in range(steps):
            w = w + self.h * (b - w @ self.A)
            path.append(w.copy())
        return np.stack(path)

    def neg_log_joint(self, pert, w):
        """-log p~ by scipy, for every particle: w (k, D)."""
        y_t, w_t = np.asarray(pert.y), np.asarray(pert.anchor["w"])
        ll = stats.norm.logpdf(y_t, w @ self.Phi.T, np.sqrt(NOISE_VAR)).sum(1)
        lp = stats.norm.logpdf(w, w_t, np.sqrt(PRIOR_VAR)).sum(1)
        return -(ll + lp)

    def maps(self, pert):
        return linear.perturbed_map(self.post, self.Phi, np.asarray(pert.y), np.asarray(pert.anchor["w"]))


def _record(p):
    return {"w0": p["w"][:, 0], "sq": jnp.sum(p["w"] ** 2, axis=1)}


@pytest.fixture(scope="module")
def prob():
    return LinearProblem()


@pytest.fixture(scope="module")
def sgd_run(prob):
    k = 16
    snaps = (0, 1, 7, prob.steps)
    res = prob.train(
        jax.random.key(0),
        n_particles=k,
        opt=ensemble.optimizer("sgd", prob.h),
        steps=prob.steps,
        snapshot_steps=snaps,
        record=_record,
    )
    return res, prob.gd_path(res.perturbation, np.asarray(res.perturbation.anchor["w"]), prob.steps)


def test_problem_is_in_the_regime_the_tests_assume(prob):
    assert prob.h < 2 / prob.lam_max and 0 < prob.rho < 1
    assert 10 < prob.steps < 2000


def test_sgd_particles_converge_to_their_perturbed_maps(prob, sgd_run):
    """||w_T - w*|| <= rho^T ||w_0 - w*|| (plus round-off) for each particle, with its own closed-form MAP."""
    res, _ = sgd_run
    w_star = prob.maps(res.perturbation)
    w0, wT = np.asarray(res.init_params["w"]), np.asarray(res.params["w"])
    err, err0 = np.linalg.norm(wT - w_star, axis=1), np.linalg.norm(w0 - w_star, axis=1)
    bound = prob.rho**prob.steps * err0 + 1e-12 * np.linalg.norm(w_star, axis=1)
    assert np.all(err <= bound), (err, bound)
    # The particles are distinct: each has its own replicate, hence its own MAP.
    assert np.min(np.linalg.norm(w_star[:, None] - w_star[None], axis=2) + np.eye(len(w_star))) > 1e-3
    assert not res.diverged.any() and res.diverged.shape == (16,)


def test_particles_start_at_their_anchors(sgd_run):
    res, _ = sgd_run
    np.testing.assert_array_equal(np.asarray(res.init_params["w"]), np.asarray(res.perturbation.anchor["w"]))
    assert res.perturbation.y.shape == (16, 25)


def test_snapshots_equal_a_hand_written_loop(prob, sgd_run):
    res, path = sgd_run
    assert res.snapshot_steps == (0, 1, 7, prob.steps)
    snaps = np.asarray(res.snapshots["w"])
    assert snaps.shape == (4, 16, 4)
    np.testing.assert_array_equal(
        snaps[0], np.asarray(res.perturbation.anchor["w"])
    )  # snapshot 0 = init = anchors
    for i, t in enumerate(res.snapshot_steps):
        np.testing.assert_allclose(snaps[i], path[t], rtol=1e-10, atol=1e-12, err_msg=f"step {t}")
    np.testing.assert_allclose(np.asarray(res.params["w"]), path[-1], rtol=1e-10, atol=1e-12)


def test_record_is_taken_before_the_first_step_and_after_every_step(prob, sgd_run):
    res, path = sgd_run
    rec = res.records
    assert set(rec) == {"w0", "sq"}
    assert rec["w0"].shape == (prob.steps + 1, 16) and rec["sq"].shape == (prob.steps + 1, 16)
    first = _record(res.init_params)
    np.testing.assert_array_equal(rec["w0"][0], np.asarray(first["w0"]))
    np.testing.assert_array_equal(rec["sq"][0], np.asarray(first["sq"]))
    np.testing.assert_allclose(rec["w0"], path[:, :, 0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rec["sq"], np.sum(path**2, axis=2), rtol=1e-10, atol=1e-12)


def test_loss_is_the_negative_perturbed_log_joint_before_each_step(prob, sgd_run):
    res, path = sgd_run
    assert res.loss.shape == (prob.steps, 16)
    want = np.stack([prob.neg_log_joint(res.perturbation, path[t]) for t in range(prob.steps)])
    np.testing.assert_allclose(res.loss, want, rtol=1e-10)
    # Gradient ascent at h <= 1/lambda_max on a concave quadratic never decreases log p~.
    assert np.all(np.diff(res.loss, axis=0) <= 1e-9 * np.abs(res.loss[1:]))


def test_vmapped_particles_equal_particles_trained_alone():
    """k particles trained at once (vmap) equal each particle trained on its own with optax directly.

    A nonlinear model and a stateful optimizer (Adagrad), so that any mixing between particles, or of their
    optimizer states, would show.
    """
    model = models.mlp(1, (6,), "tanh")
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, 12)
    y = np.sin(2 * x) + 0.1 * rng.normal(size=12)
    steps, noise_var = 15, 0.1
    opt = ensemble.optimizer("adagrad", 0.05)
    res = ensemble.train(
        jax.random.key(3), model, x, y, noise_var=noise_var, n_particles=3, opt=opt, steps=steps
    )
    tx = optax.adagrad(0.05, initial_accumulator_value=0.1, eps=1e-7)

    @jax.jit
    def solo(params, pert):
        def loss(p):
            return -perturb.perturbed_log_joint(model, p, jnp.asarray(x), pert, noise_var)

        def one_step(carry, _):
            params, state = carry
            value, g = jax.value_and_grad(loss)(params)
            updates, state = tx.update(g, state, params)
            return (optax.apply_updates(params, updates), state), value

        (params, _), losses = jax.lax.scan(one_step, (params, tx.init(params)), None, length=steps)
        return params, losses

    for i in range(3):

        def pick(a, i=i):
            return a[i]

        p_i, loss_i = solo(jax.tree.map(pick, res.init_params), jax.tree.map(pick, res.perturbation))
        for a, b in zip(jax.tree.leaves(jax.tree.map(pick, res.params)), jax.tree.leaves(p_i), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(res.loss[:, i], np.asarray(loss_i), rtol=1e-12)


def test_huge_step_size_raises_diverged_particles_error(prob):
    k, steps = 4, 300
    opt = ensemble.optimizer("sgd", 50 * prob.h)  # |1 - h lambda_max| = 49: overflows within ~200 steps
    kwargs = dict(noise_var=NOISE_VAR, n_particles=k, opt=opt, steps=steps)
    rep = ensemble.train(jax.random.key(4), prob.model, prob.Phi, prob.y, on_diverged="report", **kwargs)
    assert rep.diverged.dtype == bool and rep.diverged.shape == (k,) and rep.diverged.all()
    bad = ~np.isfinite(rep.loss).all(axis=1)
    first = int(np.argmax(bad))
    assert bad[first] and not bad[:first].any() and 0 < first < steps

    with pytest.raises(ensemble.DivergedParticlesError) as info:
        ensemble.train(jax.random.key(4), prob.model, prob.Phi, prob.y, **kwargs)
    err = info.value
    assert f"{k} of {k} particles diverged" in str(err)
    assert f"at step {first}" in str(err)
    assert f"{steps} steps" in str(err) and "on_diverged='report'" in str(err)
    assert err.first_step == first
    np.testing.assert_array_equal(err.diverged, rep.diverged)


def test_bad_on_diverged_value(prob):
    with pytest.raises(ValueError, match="on_diverged"):
        prob.train(
            jax.random.key(0),
            n_particles=2,
            opt=ensemble.optimizer("sgd", prob.h),
            steps=1,
            on_diverged="ignore",
        )


def test_train_validates_its_data(prob):
    y = prob.y.copy()
    y[3] = np.nan
    with pytest.raises(ValueError, match="y contains 1 NaN"):
        ensemble.train(
            jax.random.key(0),
            prob.model,
            prob.Phi,
            y,
            noise_var=NOISE_VAR,
            n_particles=2,
            opt=ensemble.optimizer("sgd", prob.h),
            steps=1,
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(steps=-1), "steps must be non-negative"),
        (dict(steps=5, snapshot_steps=(0, 6)), r"snapshot steps must lie in \[0, 5\]"),
        (dict(steps=5, snapshot_steps=(-1,)), "snapshot steps"),
        (dict(steps=5, n_particles=0), "n_particles must be at least 1"),
    ],
)
def test_train_argument_errors(prob, kwargs, match):
    kw = dict(noise_var=NOISE_VAR, n_particles=2, opt=ensemble.optimizer("sgd", prob.h))
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ensemble.train(jax.random.key(0), prob.model, prob.Phi, prob.y, **kw)


def test_unknown_optimizer():
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        ensemble.optimizer("rmsprop", 0.1)


@pytest.mark.parametrize("lr", [0.0, -0.1, float("nan"), float("inf")])
def test_bad_learning_rate(lr):
    with pytest.raises(ValueError, match="learning rate must be a positive finite number"):
        ensemble.optimizer("sgd", lr)


def test_unknown_lbfgs_line_search():
    with pytest.raises(ValueError, match="unknown L-BFGS line search 'backtracking'"):
        ensemble.optimizer("lbfgs", 1.0, linesearch="backtracking")


@pytest.mark.parametrize("name", ["sgd", "adam", "adagrad", "lbfgs"])
def test_unexpected_optimizer_options_are_rejected(name):
    """An option the optimizer does not have (here sgd's momentum) must not be silently dropped."""
    with pytest.raises(TypeError, match=f"optimizer '{name}' does not take \\['momentum'\\]"):
        ensemble.optimizer(name, 0.1, momentum=0.9)


def test_optimizer_descriptions():
    assert ensemble.optimizer("sgd", 0.01).description == "gradient ascent, h=0.01"
    assert (
        "initial accumulator 0"
        in ensemble.optimizer("adagrad", 0.1, initial_accumulator_value=0.0).description
    )
    assert not ensemble.optimizer("adagrad", 0.1).needs_value
    assert ensemble.optimizer("lbfgs", 1.0, linesearch="zoom").needs_value


@pytest.mark.parametrize("linesearch", [None, "zoom"])
def test_lbfgs_converges_to_the_perturbed_maps(prob, linesearch):
    """L-BFGS on the quadratic: after 40 steps every particle is at its closed-form MAP to round-off."""
    opt = ensemble.optimizer("lbfgs", 1.0, linesearch=linesearch)
    res = ensemble.train(
        jax.random.key(5), prob.model, prob.Phi, prob.y, noise_var=NOISE_VAR, n_particles=6, opt=opt, steps=40
    )
    w_star = prob.maps(res.perturbation)
    np.testing.assert_allclose(np.asarray(res.params["w"]), w_star, rtol=1e-8, atol=1e-10)


def test_adagrad_and_adam_run_and_approach_the_maps(prob):
    for opt in (ensemble.optimizer("adagrad", 0.5), ensemble.optimizer("adam", 0.05)):
        res = prob.train(
            jax.random.key(6),
            n_particles=5,
            opt=opt,
            steps=300,
        )
        w_star = prob.maps(res.perturbation)
        d0 = np.linalg.norm(np.asarray(res.init_params["w"]) - w_star, axis=1)
        d = np.linalg.norm(np.asarray(res.params["w"]) - w_star, axis=1)
        assert np.all(np.isfinite(d)) and np.all(d < 0.1 * d0), (opt.description, d / d0)


def test_unperturbed_ensemble_converges_to_the_posterior_mean(prob):
    """Without perturbations every particle climbs the same log p(D, w): all reach the posterior mean."""
    k = 8
    res = prob.train(
        jax.random.key(7),
        n_particles=k,
        opt=ensemble.optimizer("sgd", prob.h),
        steps=prob.steps,
        perturb_labels=False,
        perturb_prior=False,
    )
    np.testing.assert_array_equal(np.asarray(res.perturbation.y), np.broadcast_to(prob.y, (k, prob.y.size)))
    np.testing.assert_array_equal(np.asarray(res.perturbation.anchor["w"]), 0.0)
    w0 = np.asarray(res.init_params["w"])
    assert np.all(np.abs(w0).sum(1) > 0)  # independent prior draws, not the (zero) anchors
    err = np.linalg.norm(np.asarray(res.params["w"]) - prob.post.mean, axis=1)
    bound = prob.rho**prob.steps * np.linalg.norm(w0 - prob.post.mean, axis=1) + 1e-12 * np.linalg.norm(
        prob.post.mean
    )
    assert np.all(err <= bound)


def test_one_flag_at_a_time(prob):
    common = dict(noise_var=NOISE_VAR, n_particles=4, opt=ensemble.optimizer("sgd", prob.h), steps=0)
    labels_only = ensemble.train(
        jax.random.key(8), prob.model, prob.Phi, prob.y, perturb_prior=False, **common
    )
    assert not np.allclose(np.asarray(labels_only.perturbation.y), prob.y[None])
    np.testing.assert_array_equal(np.asarray(labels_only.perturbation.anchor["w"]), 0.0)
    prior_only = ensemble.train(
        jax.random.key(8), prob.model, prob.Phi, prob.y, perturb_labels=False, **common
    )
    np.testing.assert_array_equal(
        np.asarray(prior_only.perturbation.y), np.broadcast_to(prob.y, (4, prob.y.size))
    )
    np.testing.assert_array_equal(
        np.asarray(prior_only.init_params["w"]), np.asarray(prior_only.perturbation.anchor["w"])
    )
    assert np.all(np.abs(np.asarray(prior_only.perturbation.anchor["w"])).sum(1) > 0)


def test_zero_steps(prob):
    res = prob.train(
        jax.random.key(9),
        n_particles=3,
        opt=ensemble.optimizer("sgd", prob.h),
        steps=0,
        snapshot_steps=(0,),
        record=_record,
    )
    assert res.loss.shape == (0, 3)
    np.testing.assert_array_equal(np.asarray(res.params["w"]), np.asarray(res.init_params["w"]))
    np.testing.assert_array_equal(np.asarray(res.snapshots["w"][0]), np.asarray(res.init_params["w"]))
    assert res.records["w0"].shape == (1, 3)


def _same_result(a, b):
    """The same numbers (bitwise on this CPU; 1e-13 leaves room only for XLA's loop optimisations)."""
    leaves_a = jax.tree.leaves((a.params, a.snapshots, a.records, a.loss))
    leaves_b = jax.tree.leaves((b.params, b.snapshots, b.records, b.loss))
    assert len(leaves_a) == len(leaves_b)
    for u, v in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-13, atol=0)


@pytest.mark.parametrize("steps", [37, 10])
def test_chunking_and_progress_do_not_change_the_numbers(prob, steps, capsys):
    common = dict(
        noise_var=NOISE_VAR,
        n_particles=5,
        opt=ensemble.optimizer("sgd", prob.h),
        steps=steps,
        snapshot_steps=(0, 3, steps),
        record=_record,
    )
    plain = ensemble.train(jax.random.key(10), prob.model, prob.Phi, prob.y, **common)
    bar = ensemble.train(jax.random.key(10), prob.model, prob.Phi, prob.y, progress="testing", **common)
    _same_result(plain, bar)
    # 4 chunks of 3 steps for 10 steps (not a divisor): the padded steps must do nothing.
    chunked = ensemble.train(jax.random.key(10), prob.model, prob.Phi, prob.y, n_chunks=4, **common)
    _same_result(plain, chunked)
    assert plain.loss.shape == (steps, 5) and plain.records["w0"].shape == (steps + 1, 5)
    assert "testing" in capsys.readouterr().err


def test_compiler_options_reach_the_compiled_loop_and_change_only_rounding():
    """CPU_REDUCE_WITHOUT_YNN compiles the loop with XLA's own reductions: the same particles to float rounding
    (10 000 toy-ReLU particles on 24 points, where the option matters); an option XLA cannot read fails the
    compilation (so the options do reach it); options that are not a mapping of names are refused."""
    model = models.toy_relu(1.0)
    x = np.linspace(-0.4, 0.4, 24)
    y = np.maximum(2.0 * x, 0) + np.maximum(-1.5 * x, 0)
    common = dict(noise_var=0.05, n_particles=10_000, opt=ensemble.optimizer("sgd", 0.05), steps=50,
                  snapshot_steps=(0, 50))
    plain = ensemble.train(jax.random.key(3), model, x, y, **common)
    other = ensemble.train(jax.random.key(3), model, x, y, compiler_options=ensemble.CPU_REDUCE_WITHOUT_YNN,
                           **common)
    for u, v in zip(jax.tree.leaves((plain.params, plain.snapshots, plain.loss)),
                    jax.tree.leaves((other.params, other.snapshots, other.loss)), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-11, atol=1e-13)
    with pytest.raises(Exception, match="xla_cpu_experimental_ynn_fusion_type"):
        ensemble.train(jax.random.key(3), model, x, y, **common,
                       compiler_options={"xla_cpu_experimental_ynn_fusion_type": "NOT_A_FUSION_TYPE"})
    for bad in (["xla_cpu_experimental_ynn_fusion_type"], {1: "x"}):
        with pytest.raises(ValueError, match="compiler_options"):
            ensemble.train(jax.random.key(3), model, x, y, **common, compiler_options=bad)


def test_features_of_a_linear_model_are_computed_once_outside_the_loop():
    """A model linear in its parameters trains on its features computed once (never traced into the compiled
    loop): the same particles, to rounding, as the model written as a function of given features."""
    omega = jnp.asarray([0.5, -1.1, 2.0, 0.2])
    base = models.trig_features(omega)
    traced = []

    def features(x):
        traced.append(isinstance(x, jax.core.Tracer))
        return base.features(x)

    model = models.linear_in_features(features, 4, name="counted trig features")
    x = np.linspace(-2.0, 2.0, 15)
    y = np.sin(x)
    common = dict(noise_var=0.3, n_particles=6, opt=ensemble.optimizer("adam", 0.05), steps=40,
                  snapshot_steps=(0, 40))
    res = ensemble.train(jax.random.key(4), model, x, y, **common)
    # Evaluated once on the data; traced at most once, by the check of the model's output shape.
    assert traced.count(False) == 1 and traced.count(True) <= 1
    ref = ensemble.train(jax.random.key(4), models.given_features(base), np.asarray(base.features(jnp.asarray(x))),
                         y, **common)
    for u, v in zip(jax.tree.leaves((res.params, res.snapshots, res.loss)),
                    jax.tree.leaves((ref.params, ref.snapshots, ref.loss)), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-14)


def test_float32_training_stays_float32(prob):
    res = prob.train(
        jax.random.key(11),
        n_particles=3,
        opt=ensemble.optimizer("sgd", prob.h),
        steps=prob.steps,
        dtype=jnp.float32,
    )
    assert res.params["w"].dtype == jnp.float32 and res.perturbation.y.dtype == jnp.float32
    w_star = prob.maps(res.perturbation)
    # Each float32 step adds round-off ~ eps |w| (times a modest factor for the sums over the n points); the
    # contraction accumulates it at most 1 / (1 - rho) = lambda_max / lambda_min times.
    kappa = prob.lam_max / prob.lam_min
    atol = 100 * np.finfo(np.float32).eps * kappa * np.abs(w_star).max()
    np.testing.assert_allclose(np.asarray(res.params["w"]), w_star, rtol=0, atol=atol)


def test_predict_shape(prob, sgd_run):
    res, _ = sgd_run
    f = np.asarray(ensemble.predict(prob.model, res.params, jnp.asarray(prob.Phi[:7])))
    assert f.shape == (16, 7)
    np.testing.assert_allclose(f, np.asarray(res.params["w"]) @ prob.Phi[:7].T, rtol=1e-12)


def test_per_point_noise_variance(prob):
    """Heteroscedastic likelihood (one sigma_i^2 per point): each particle converges to the MAP of its
    replicate, w* = (Phi^T S^-1 Phi + I/alpha^2)^-1 (Phi^T S^-1 y~ + w~/alpha^2) with S = diag(sigma_i^2),
    solved directly."""
    var = np.linspace(0.2, 2.0, prob.y.size)
    A = prob.Phi.T @ (prob.Phi / var[:, None]) + np.eye(prob.Phi.shape[1]) / PRIOR_VAR
    eig = np.linalg.eigvalsh(A)
    h, rho = 1 / eig[-1], 1 - eig[0] / eig[-1]
    steps = math.ceil(np.log(1e-11) / np.log(rho))
    res = ensemble.train(
        jax.random.key(12),
        prob.model,
        prob.Phi,
        prob.y,
        noise_var=var,
        n_particles=5,
        opt=ensemble.optimizer("sgd", h),
        steps=steps,
    )
    y_t, w_t = np.asarray(res.perturbation.y), np.asarray(res.perturbation.anchor["w"])
    w_star = np.linalg.solve(A, ((y_t / var) @ prob.Phi + w_t / PRIOR_VAR).T).T
    err = np.linalg.norm(np.asarray(res.params["w"]) - w_star, axis=1)
    w0 = np.asarray(res.init_params["w"])
    assert np.all(
        err <= rho**steps * np.linalg.norm(w0 - w_star, axis=1) + 1e-12 * np.linalg.norm(w_star, axis=1)
    )


def test_snapshot_steps_are_sorted_and_deduplicated(prob):
    res = prob.train(
        jax.random.key(13),
        n_particles=2,
        opt=ensemble.optimizer("sgd", prob.h),
        steps=6,
        snapshot_steps=[6, 0, 3, 3],
    )
    assert res.snapshot_steps == (0, 3, 6)
    path = prob.gd_path(res.perturbation, np.asarray(res.init_params["w"]), 6)
    np.testing.assert_allclose(np.asarray(res.snapshots["w"]), path[[0, 3, 6]], rtol=1e-12, atol=1e-14)


def test_multi_output_labels_and_per_label_noise():
    """A model with C outputs takes (n, C) labels and one noise variance per label; its loss is the sum of
    the C Gaussian log likelihoods (checked through the unperturbed single-step gradient against autodiff)."""
    model = models.mlp(1, (4,), out_dim=3)
    x = np.linspace(-1, 1, 5)
    y = np.random.default_rng(0).normal(size=(5, 3))
    var = np.random.default_rng(1).uniform(0.5, 2.0, size=(5, 3))
    res = ensemble.train(jax.random.key(0), model, x, y, noise_var=var, n_particles=3,
                         opt=ensemble.optimizer("sgd", 1e-3), steps=1, perturb_labels=False, perturb_prior=False)
    p0 = jax.tree.map(lambda a: a[0], res.init_params)
    f = np.asarray(model.apply(p0, jnp.asarray(x)))
    want = 0.5 * np.sum((y - f) ** 2 / var + np.log(2 * np.pi * var)) - float(models.prior_logpdf(model, p0))
    assert res.loss[0, 0] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    "out_dim, y_shape, var_shape, match",
    [
        (1, (5, 2), (), r"labels y must be a vector"),
        (2, (5,), (), r"labels y must have shape \(n, 2\)"),
        (2, (5, 3), (), r"labels y must have shape \(n, 2\)"),
        (2, (5, 2), (5, 3), r"noise_var must be a scalar or have shape \(5,\) or \(5, 2\)"),
    ],
)
def test_label_shape_must_match_the_model_outputs(out_dim, y_shape, var_shape, match):
    model = models.mlp(1, (4,), out_dim=out_dim)
    with pytest.raises(ValueError, match=match):
        ensemble.train(jax.random.key(0), model, np.zeros(5), np.zeros(y_shape), noise_var=np.ones(var_shape),
                       n_particles=2, opt=ensemble.optimizer("sgd", 1e-3), steps=1)


def _line_search_problem():
    model = models.mlp(3, (6,), "tanh")
    x = jax.random.normal(jax.random.key(11), (24, 3))
    y = jnp.sin(x @ jnp.array([1.0, -0.5, 0.3]))
    opt = ensemble.optimizer("lbfgs", 0.5, linesearch="zoom")
    state = ensemble.init(jax.random.key(12), model, y, 0.1, 5, opt)
    return model, x, jnp.asarray(0.1), opt, state


def test_ensemble_step_with_line_search_equals_the_vmapped_particle_step_with_fewer_evaluations():
    """The ensemble step reads the line search's stored value and gradient once for all particles. Its
    particles must be those of ``vmap`` over the single-particle step, including the first step (nothing
    stored) and a particle whose stored value is not finite (recomputed alone); and it must run fewer model
    evaluations (counted by a host callback in the model): after the first step the vmapped single-particle
    step still evaluates every particle before its line search (its ``lax.cond`` became a ``select``)."""
    model, x, nv, opt, state = _line_search_problem()
    pert = state.perturbation
    calls = {"ref": [], "new": []}

    def counted(name):
        def apply(p, xx):
            jax.debug.callback(lambda: calls[name].append(1))
            return model.apply(p, xx)

        return model._replace(apply=apply)

    ref_step = jax.jit(jax.vmap(ensemble.particle_step(counted("ref"), opt), in_axes=(0, 0, 0, None, None)))
    step_new = jax.jit(lambda s: ensemble.step(s, counted("new"), opt, x, nv))

    def new_step(params, opt_state, pert, x, nv):
        s, info = step_new(ensemble.State(params, opt_state, pert, jnp.zeros((), jnp.int32)))
        return s.params, s.opt_state, info.loss
    is_ls = lambda s: hasattr(s, "value") and hasattr(s, "grad")  # noqa: E731
    spoil = lambda s: s._replace(value=s.value.at[2].set(jnp.nan)) if is_ls(s) else s  # noqa: E731
    pa, sa, pb, sb = state.params, state.opt_state, state.params, state.opt_state
    for t in range(8):
        if t == 1:
            jax.effects_barrier()
            calls["ref"].clear()
            calls["new"].clear()
        if t == 4:  # spoil particle 2's stored value in both runs: it must be recomputed, the others kept
            jax.effects_barrier()
            counts = {k: len(v) for k, v in calls.items()}
            sa = jax.tree.map(spoil, sa, is_leaf=is_ls)
            sb = jax.tree.map(spoil, sb, is_leaf=is_ls)
        pa, sa, va = ref_step(pa, sa, pert, x, nv)
        pb, sb, vb = new_step(pb, sb, pert, x, nv)
        np.testing.assert_allclose(np.asarray(vb), np.asarray(va), rtol=1e-12)
        for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-10, atol=1e-12)
    assert np.all(np.isfinite(np.asarray(vb)))
    assert 0 < counts["new"] < counts["ref"], counts


@pytest.mark.parametrize("perturb_prior", [True, False])
def test_the_first_k_particles_of_a_larger_ensemble_are_the_k_particle_ensemble(perturb_prior):
    """Particle i's replicate and start come from fold_in(key, i): training 3 or 8 particles from one key
    gives the same first 3 particles (their replicates, starts and trained values)."""
    model = models.mlp(2, (6,), "tanh", weight_var=1.0, bias_var=1.0)
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(12, 2)), rng.normal(size=12)
    runs = {k: ensemble.train(jax.random.key(5), model, x, y, noise_var=0.3, n_particles=k,
                              opt=ensemble.optimizer("adam", 1e-2), steps=30, perturb_prior=perturb_prior, dtype=jnp.float64)
            for k in (3, 8)}
    small, big = runs[3], runs[8]
    for tree in ("init_params", "params", "perturbation"):
        for a, b in zip(jax.tree.leaves(getattr(big, tree)), jax.tree.leaves(getattr(small, tree)), strict=True):
            np.testing.assert_allclose(np.asarray(a)[:3], np.asarray(b), rtol=1e-12, atol=1e-14, err_msg=tree)


def test_padding_rows_marked_unobserved_trains_the_same_particles():
    """Rows appended with ``observed=False`` (any inputs, any labels) change nothing: the particles, their losses
    and the observed rows' replicates are those of the unpadded data, up to float rounding (float64 here), with
    the line-search L-BFGS, whose path would show any difference in the objective."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(40, 3)), np.sin(rng.normal(size=40))
    model = models.mlp(3, (12,))
    kw = dict(noise_var=0.1, n_particles=6, opt=ensemble.optimizer("lbfgs", 1.0, linesearch="zoom"), steps=30,
              dtype=np.float64)
    plain = ensemble.train(jax.random.key(2), model, x, y, **kw)
    xp = np.concatenate([x, 3 * rng.normal(size=(9, 3))])
    yp = np.concatenate([y, 10 + rng.normal(size=9)])
    padded = ensemble.train(jax.random.key(2), model, xp, yp, observed=np.arange(49) < 40, **kw)
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(padded.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(padded.loss, plain.loss, rtol=1e-10)
    np.testing.assert_array_equal(np.asarray(padded.perturbation.y[:, :40]), np.asarray(plain.perturbation.y))
    np.testing.assert_array_equal(np.asarray(padded.perturbation.y[:, 40:]), np.tile(yp[40:], (6, 1)))
    with pytest.raises(ValueError, match="observed must have one entry per row"):
        ensemble.train(jax.random.key(2), model, xp, yp, observed=np.ones(40, bool), **kw)
