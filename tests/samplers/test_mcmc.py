"""bootens_core.samplers: the reference samplers against exact posteriors and closed forms, the bookkeeping of
burn-in and thinning against independent re-computations, and the diagnostics against known answers.

Statistical tolerances come from the Monte-Carlo error of the quantity checked (4 standard errors unless said).
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bootens_core.exact import linear
from bootens_core import samplers, models

NOISE_VAR, PRIOR_VAR = 0.25, 0.7  # not 1, so that a swapped or dropped variance shows


class LinearProblem:
    """Bayesian linear regression ``y = Phi w + eps`` (3 features, 20 points by default): exact posterior known."""

    def __init__(self, n=20, D=3, seed=0):
        rng = np.random.default_rng(seed)
        self.Phi = rng.normal(size=(n, D))
        self.y = self.Phi @ rng.normal(size=D) + math.sqrt(NOISE_VAR) * rng.normal(size=n)
        self.model = models.linear_in_features(lambda x: x, D, prior_var=PRIOR_VAR)
        self.post = linear.posterior(self.Phi, self.y, NOISE_VAR, PRIOR_VAR)
        self.var = np.diag(self.post.cov)


@pytest.fixture(scope="module")
def prob():
    return LinearProblem()


def _check_against_posterior(prob, res, min_ess):
    """Mean and variance of every coordinate of the draws against the exact posterior, and R-hat."""
    w = np.asarray(res.params["w"])  # (C, n, D)
    assert w.shape[2] == 3
    flat = w.reshape(-1, 3)
    ess_mean = samplers.ess(w, "mean")
    ess_bulk = samplers.ess(w, "bulk")
    assert np.all(ess_bulk > min_ess), ess_bulk
    # The Monte-Carlo standard error of a mean is sd / sqrt(ESS of the mean).
    sd = np.sqrt(prob.var)
    np.testing.assert_array_less(np.abs(flat.mean(0) - prob.post.mean), 4 * sd / np.sqrt(ess_mean))
    # For N independent Gaussian draws Var(sample variance) = 2 var^2 / (N - 1), so its sd is
    # sqrt(2) var / sqrt(N). For the autocorrelated chain N becomes the ESS of (theta - mu)^2; its
    # autocorrelations are smaller than those of theta (rho^2 for an AR(1)), so the bulk ESS of theta is
    # a conservative stand-in.
    np.testing.assert_array_less(np.abs(flat.var(0) - prob.var), 4 * math.sqrt(2) * prob.var / np.sqrt(ess_bulk))
    assert np.all(samplers.rhat(w) < 1.05)


# ------------------------------------------------------------------------------------------ log density


def test_log_density_fn_is_the_log_joint(prob):
    log_density, unravel = samplers.log_density_fn(prob.model, prob.Phi, prob.y, NOISE_VAR)
    w = np.random.default_rng(1).normal(size=3)
    expected = stats.norm.logpdf(prob.y, prob.Phi @ w, math.sqrt(NOISE_VAR)).sum() + stats.norm.logpdf(
        w, 0, math.sqrt(PRIOR_VAR)
    ).sum()
    assert float(log_density(jnp.asarray(w))) == pytest.approx(expected, rel=1e-12)
    np.testing.assert_array_equal(np.asarray(unravel(jnp.asarray(w))["w"]), w)


# --------------------------------------------------------------------------- samplers against the truth


@pytest.mark.slow
def test_mh_matches_exact_linear_posterior(prob):
    # Proposal variance 2.38^2 / D times the mean posterior variance (the classic random-walk scaling).
    pv = 2.38**2 / 3 * prob.var.mean()
    res = samplers.metropolis_model(
        jax.random.key(0), prob.model, prob.Phi, prob.y, noise_var=NOISE_VAR, n_chains=10, proposal_var=pv,
        n_draws=1500, burn_in=1000, thin=2,
    )
    assert res.params["w"].shape == (10, 1500, 3)
    assert res.log_density.shape == (10, 1500)
    assert 0.15 < res.accept_rate.mean() < 0.6
    _check_against_posterior(prob, res, min_ess=1000)
    # The carried log density is the log joint of the kept state.
    log_density, _ = samplers.log_density_fn(prob.model, prob.Phi, prob.y, NOISE_VAR)
    recomputed = jax.vmap(jax.vmap(log_density))(jnp.asarray(res.params["w"][:, :50]))
    np.testing.assert_allclose(res.log_density[:, :50], np.asarray(recomputed), rtol=1e-12)
    json.dumps(res.info)
    assert res.sampler.startswith("random-walk MH")


@pytest.mark.slow
@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
def test_nuts_matches_exact_linear_posterior(prob, chain_method):
    res = samplers.nuts_model(
        jax.random.key(1), prob.model, prob.Phi, prob.y, noise_var=NOISE_VAR, n_chains=4, n_warmup=300,
        n_draws=800, chain_method=chain_method,
    )
    assert res.info["chain_method"] == chain_method
    assert res.params["w"].shape == (4, 800, 3)
    assert res.log_density.shape == (4, 800)
    _check_against_posterior(prob, res, min_ess=1000)
    log_density, _ = samplers.log_density_fn(prob.model, prob.Phi, prob.y, NOISE_VAR)
    recomputed = jax.vmap(jax.vmap(log_density))(jnp.asarray(res.params["w"][:, :50]))
    np.testing.assert_allclose(res.log_density[:, :50], np.asarray(recomputed), rtol=1e-10)
    info = json.loads(json.dumps(res.info))
    assert len(info["step_size"]) == len(info["n_divergent"]) == len(info["mean_num_steps"]) == 4
    assert info["n_divergent"] == [0, 0, 0, 0]
    assert info["n_warmup"] == 300 and info["max_tree_depth"] == 10 and info["target_accept"] == 0.8
    assert np.all((res.accept_rate > 0.5) & (res.accept_rate <= 1))


@pytest.mark.parametrize("s", [0.5, 2.4, 6.0])
def test_mh_acceptance_rate_on_standard_normal(s):
    # Target N(0, 1), proposal x + s z: at stationarity P(accept) = (2 / pi) arctan(2 / s).
    n_chains, n_draws = 200, 2000
    init = jax.random.normal(jax.random.key(10), (n_chains, 1))  # chains start at stationarity
    _, _, acc, _ = samplers.metropolis(
        jax.random.key(11), lambda th: -0.5 * jnp.sum(th**2), init, proposal_var=s**2, n_draws=n_draws,
        burn_in=0, thin=1,
    )
    acc = np.asarray(acc)
    expected = 2 / np.pi * np.arctan(2 / s)
    # Chains are independent, so the standard error of the mean rate is the spread of the per-chain rates
    # over sqrt(n_chains) (it accounts for the autocorrelation of the accept indicators within a chain).
    se = acc.std(ddof=1) / math.sqrt(n_chains)
    assert abs(acc.mean() - expected) < 4 * se, (acc.mean(), expected, se)
    # ... and that error is near the binomial one, inflated by at most a small factor.
    assert se < 3 * math.sqrt(expected * (1 - expected) / (n_chains * n_draws))


def test_non_finite_proposals_are_rejected():
    # Uniform target on (0, 1)^2 whose log density is -inf below 0 and NaN above 1.
    def log_density(th):
        return jnp.where(jnp.any(th > 1), jnp.nan, jnp.where(jnp.any(th < 0), -jnp.inf, 0.0))

    init = jnp.full((20, 2), 0.5)
    draws, logp, acc, _ = samplers.metropolis(
        jax.random.key(3), log_density, init, proposal_var=0.3**2, n_draws=500, burn_in=0, thin=2
    )
    draws = np.asarray(draws)
    assert np.all((draws > 0) & (draws < 1))
    assert np.all(np.asarray(logp) == 0)
    assert 0.2 < float(np.mean(acc)) < 0.9
    # The chains sample the uniform: mean 1/2, sd 1/sqrt(12); 20000 draws with ESS well above 2000.
    assert abs(draws.mean() - 0.5) < 4 * (1 / math.sqrt(12)) / math.sqrt(2000)


# -------------------------------------------------------------------------- burn-in/thinning bookkeeping


def _flat(th):
    return jnp.zeros((), th.dtype)


def test_kept_states_are_the_right_iterates():
    # A flat log density accepts every proposal, so chain c is the random walk of its documented keys:
    # step t adds sqrt(pv) * normal(split(fold_in(split(key, C)[c], t))[0]). Recomputed step by step here.
    C, m, pv, burn_in, thin, n_draws = 3, 2, 0.7, 7, 5, 4
    init = jnp.arange(C * m, dtype=jnp.float64).reshape(C, m)
    key = jax.random.key(5)
    draws, logp, acc, acc_burn = samplers.metropolis(
        key, _flat, init, proposal_var=pv, n_draws=n_draws, burn_in=burn_in, thin=thin
    )
    assert draws.shape == (C, n_draws, m) and logp.shape == (C, n_draws)
    np.testing.assert_array_equal(np.asarray(acc), 1.0)
    np.testing.assert_array_equal(np.asarray(acc_burn), 1.0)
    chain_keys = jax.random.split(key, C)
    expected = np.zeros((C, n_draws, m))
    for c in range(C):
        pos = np.asarray(init[c])
        for t in range(burn_in + n_draws * thin):
            k_prop, _ = jax.random.split(jax.random.fold_in(chain_keys[c], t))
            pos = pos + math.sqrt(pv) * np.asarray(jax.random.normal(k_prop, (m,), jnp.float64))
            if t + 1 > burn_in and (t + 1 - burn_in) % thin == 0:
                expected[c, (t + 1 - burn_in) // thin - 1] = pos
    np.testing.assert_allclose(np.asarray(draws), expected, rtol=1e-12, atol=1e-12)


def test_kept_states_count_the_steps():
    # Independent of the key scheme: on a flat density the walk after t steps has variance pv * t, so the
    # spread of draw i over many chains counts the steps taken before it (burn_in + (i + 1) thin), and the
    # spread of consecutive differences counts thin. Relative sd of a variance from C chains: sqrt(2 / C).
    C, pv, burn_in, thin, n_draws = 20000, 0.5, 30, 7, 3
    draws, *_ = samplers.metropolis(
        jax.random.key(6), _flat, jnp.zeros((C, 1)), proposal_var=pv, n_draws=n_draws, burn_in=burn_in, thin=thin
    )
    draws = np.asarray(draws)[:, :, 0]
    tol = 4 * math.sqrt(2 / C)  # 4% here: an extra or missing step of thin = 7 is 14% off
    steps = burn_in + thin * np.arange(1, n_draws + 1)
    np.testing.assert_allclose(draws.var(0) / (pv * steps), 1, atol=tol)
    np.testing.assert_allclose(np.diff(draws, axis=1).var(0) / (pv * thin), 1, atol=tol)


def test_determinism_chunking_and_chain_independence():
    def log_density(th):
        return -0.5 * jnp.sum(th**2)

    init = jnp.zeros((4, 2))  # all chains start at the same point
    kw = {"proposal_var": 1.0, "n_draws": 137, "burn_in": 64, "thin": 1}
    a = samplers.metropolis(jax.random.key(7), log_density, init, **kw)
    b = samplers.metropolis(jax.random.key(7), log_density, init, **kw)
    # With a progress bar the run is cut into chunks (ragged ones included): same draws.
    c = samplers.metropolis(jax.random.key(7), log_density, init, progress="test", **kw)
    d = samplers.metropolis(jax.random.key(8), log_density, init, **kw)
    # Chunks shorter than a thinning interval (4 steps per chunk, thin = 40) also give the same draws.
    kw_long = {"proposal_var": 1.0, "n_draws": 3, "burn_in": 5, "thin": 40}
    e = samplers.metropolis(jax.random.key(7), log_density, init, progress=True, **kw_long)
    f = samplers.metropolis(jax.random.key(7), log_density, init, **kw_long)
    for x, y in zip(e, f, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(a, c, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(a[0]), np.asarray(d[0]))
    draws = np.asarray(a[0])
    for i in range(4):
        for j in range(i):
            assert not np.any(np.all(draws[i] == draws[j], axis=-1)), (i, j)
    # Independent chains: their draws are uncorrelated (|r| < 4 / sqrt(ESS); ESS > 30 for sure here).
    corr = np.corrcoef(draws[:, :, 0])
    assert np.all(np.abs(corr[np.triu_indices(4, 1)]) < 4 / math.sqrt(30))


def test_metropolis_model_shapes_dtype_and_init():
    model = models.mlp(1, (3,), "tanh")
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, 8)
    y = np.sin(3 * x)
    init = [{k: rng.normal(size=(5, *shape)).astype(np.float32) for k, shape in layer.items()} for layer in model.shapes]
    res = samplers.metropolis_model(
        jax.random.key(1), model, x, y, noise_var=0.1, n_chains=5, proposal_var=1e-6, n_draws=3, burn_in=0,
        thin=1, init=init, dtype=jnp.float32,
    )
    for leaf, ref in zip(jax.tree.leaves(res.params), jax.tree.leaves(init), strict=True):
        assert leaf.shape == (5, 3, *ref.shape[1:])
        assert leaf.dtype == np.float32
        # One step with proposal sd 1e-3 from init: within 10 sd of it.
        assert np.all(np.abs(leaf[:, 0] - np.asarray(ref)) < 1e-2)
    assert res.log_density.shape == (5, 3) and res.accept_rate.shape == (5,)
    assert res.info["accept_rate_burn_in"] == [None] * 5
    assert res.info["n_steps_per_chain"] == 3
    assert res.sampler == "random-walk MH, proposal N(0, 1e-06 I), 5 chains, burn-in 0, thin 1"
    json.dumps(res.info)
    # Default start: independent prior draws, one per chain.
    res = samplers.metropolis_model(
        jax.random.key(1), model, x, y, noise_var=0.1, n_chains=5, proposal_var=1e-12, n_draws=1, burn_in=0, thin=1,
        dtype=jnp.float32,
    )
    w0 = np.asarray(res.params[0]["w"][:, 0, 0, 0])
    assert np.unique(w0).size == 5


# --------------------------------------------------------------------------------------------- diagnostics


def test_rhat_detects_disagreeing_chains():
    rng = np.random.default_rng(0)
    iid = rng.normal(size=(4, 1000, 2))
    # For iid chains split-R-hat ~ 1 + (F - 1) / (2 N) with F ~ chi2_7 / 7 (8 half-chains of N = 500):
    # sd ~ 0.0005, so 1.005 is about 9 sd away; rank normalisation and folding change little.
    r = samplers.rhat(iid)
    assert r.shape == (2,)
    assert np.all(np.abs(r - 1) < 0.005)
    shifted = iid.copy()
    shifted[3] += 3.0  # one chain sampled from N(3, 1)
    # Plain split-R-hat would be sqrt(1 + var of the 8 half-chain means) = sqrt(1 + 13.5 / 7) = 1.71; rank
    # normalisation squeezes the gap (ranks are bounded) but it stays hundreds of iid sd above 1.
    assert np.all(samplers.rhat(shifted) > 1.3)
    wider = iid.copy()
    wider[:2] *= 4.0  # two chains four times wider: caught by the folded (scale) half of rank-R-hat
    assert np.all(samplers.rhat(wider) > 1.2)


def test_ess_iid_and_ar1():
    rng = np.random.default_rng(1)
    iid = rng.normal(size=(4, 1000))
    # Over 200 replications the bulk ESS of 4 x 1000 iid draws had relative sd ~5%: allow 4 sd.
    assert samplers.ess(iid) == pytest.approx(4000, rel=0.2)
    assert samplers.ess(iid, "tail") == pytest.approx(4000, rel=0.3)
    rho, n = 0.9, 5000
    z = rng.normal(size=(4, n))
    ar = np.empty_like(z)
    ar[:, 0] = z[:, 0]
    for t in range(1, n):
        ar[:, t] = rho * ar[:, t - 1] + math.sqrt(1 - rho**2) * z[:, t]
    # AR(1): ESS = N (1 - rho) / (1 + rho) = 1053 for N = 20000; over 100 replications the estimate had
    # relative sd ~8%: allow 4 sd (32%).
    closed = 4 * n * (1 - rho) / (1 + rho)
    assert samplers.ess(ar) == pytest.approx(closed, rel=0.32)
    assert samplers.ess(ar, "mean") == pytest.approx(closed, rel=0.32)
    assert samplers.ess(ar) < samplers.ess(iid) * 20000 / 4000 / 5
    assert samplers.ess(np.stack([iid, iid], -1)).shape == (2,)
    with pytest.raises(ValueError, match="kind"):
        samplers.ess(iid, "median")


def test_predictive_diagnostics():
    model = models.toy_relu()
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, 10)
    y = np.maximum(x, 0) + 0.1 * rng.normal(size=10)
    res = samplers.metropolis_model(
        jax.random.key(4), model, x, y, noise_var=0.01, n_chains=4, proposal_var=0.02, n_draws=100, burn_in=200,
        thin=2,
    )
    grid = np.linspace(-1, 1, 5)  # f(0) = 0 for every draw: R-hat undefined there, and skipped
    d = samplers.predictive_diagnostics(model, res, grid)
    assert set(d) == {"rhat_max", "rhat_mean", "ess_bulk_min", "ess_tail_min", "ess_bulk_median", "n_chains", "n_draws"}
    assert d["n_chains"] == 4 and d["n_draws"] == 100
    assert all(type(v) is float for k, v in d.items() if not k.startswith("n_"))
    assert all(math.isfinite(v) for v in d.values())
    f = np.asarray(models.predict(model, jax.tree.map(lambda p: p.reshape(400, *p.shape[2:]), res.params), grid))
    r = samplers.rhat(f.reshape(4, 100, 5))
    assert np.isnan(r[2]) and np.all(np.isfinite(np.delete(r, 2)))
    assert d["rhat_max"] == pytest.approx(np.nanmax(r))
    json.dumps(d)


# ------------------------------------------------------------------------------------------------- errors


def _std_normal(th):
    return -0.5 * jnp.sum(th**2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_draws": 0}, "n_draws"),
        ({"thin": 0}, "thin"),
        ({"burn_in": -1}, "burn_in"),
        ({"proposal_var": 0.0}, "proposal_var"),
        ({"proposal_var": -1.0}, "proposal_var"),
        ({"n_draws": 2.5}, "n_draws"),
        ({"init": jnp.zeros(3)}, "init"),
        ({"init": jnp.zeros((0, 3))}, "init"),
    ],
)
def test_metropolis_errors(kwargs, match):
    args = {"init": jnp.zeros((2, 3)), "proposal_var": 1.0, "n_draws": 2, "burn_in": 0, "thin": 1, **kwargs}
    init = args.pop("init")
    with pytest.raises(ValueError, match=match):
        samplers.metropolis(jax.random.key(0), _std_normal, init, **args)


def test_non_finite_initial_state_names_the_chains():
    init = jnp.array([[0.0], [jnp.nan], [0.0], [1e200]])
    with pytest.raises(ValueError, match=r"not finite at the initial state of chain\(s\) \[1, 3\]"):
        samplers.metropolis(
            jax.random.key(0), _std_normal, init, proposal_var=1.0, n_draws=1, burn_in=0, thin=1
        )


@pytest.mark.parametrize("sampler", ["mh", "nuts"])
@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"n_chains": 0}, "n_chains"),
        ({"x": np.array([0.0, np.nan, 1.0])}, "x contains"),
        ({"y": np.array([0.0, 1.0, np.inf])}, "y contains"),
        ({"init": {"w": np.zeros((3, 2))}}, "init leaf"),
        ({"init": [np.zeros((2, 2))]}, "init"),
    ],
)
def test_model_level_errors(sampler, change, match):
    model = models.toy_relu()
    args = {"x": np.array([0.0, 0.5, 1.0]), "y": np.array([0.0, 0.4, 1.1]), "n_chains": 2, "noise_var": 0.1, **change}
    x, y = args.pop("x"), args.pop("y")
    with pytest.raises(ValueError, match=match):
        if sampler == "mh":
            samplers.metropolis_model(
                jax.random.key(0), model, x, y, proposal_var=0.1, n_draws=2, burn_in=0, thin=1, **args
            )
        else:
            samplers.nuts_model(jax.random.key(0), model, x, y, n_warmup=2, n_draws=2, **args)


def test_nuts_chain_methods_run_the_same_chains(prob):
    """Sequential and vectorized chains start from the same keys: over a few iterations (before rounding has
    been amplified) they are the same chains; "auto" is sequential on a CPU; a wrong name is refused."""
    runs = {m: samplers.nuts_model(jax.random.key(3), prob.model, prob.Phi, prob.y, noise_var=NOISE_VAR, n_chains=3,
                                   n_warmup=3, n_draws=3, chain_method=m) for m in ("vectorized", "sequential")}
    np.testing.assert_allclose(runs["sequential"].params["w"], runs["vectorized"].params["w"], rtol=1e-9)
    assert samplers.resolve_chain_method("auto") == ("sequential" if jax.default_backend() == "cpu" else "vectorized")
    assert samplers.resolve_chain_method("vectorized") == "vectorized"
    with pytest.raises(ValueError, match="chain_method 'parallel'"):
        samplers.nuts_model(jax.random.key(3), prob.model, prob.Phi, prob.y, noise_var=NOISE_VAR, n_chains=2,
                            n_warmup=2, n_draws=2, chain_method="parallel")


@pytest.mark.slow
def test_nuts_float32():
    # Under x64, NumPyro's integrator state stays float64 and the model is evaluated in float32.
    model = models.toy_relu()
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, 10).astype(np.float32)
    y = (np.maximum(x, 0) + 0.1 * rng.normal(size=10)).astype(np.float32)
    res = samplers.nuts_model(
        jax.random.key(2), model, x, y, noise_var=0.01, n_chains=2, n_warmup=50, n_draws=20, dtype=jnp.float32
    )
    assert res.params["w"].shape == (2, 20, 2) and res.params["w"].dtype == np.float32
    assert res.log_density.dtype == np.float32 and np.all(np.isfinite(res.log_density))
    assert res.sampler == "NUTS (NumPyro), target accept 0.8, max tree depth 10, 2 chains, warm-up 50, 20 draws"
