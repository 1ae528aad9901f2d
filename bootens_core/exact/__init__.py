"""Exact references and the theorems measured: Bayesian linear regression and the closed-form perturbed MAP
(:mod:`~bootens_core.exact.linear`), two-parameter posteriors on a grid (:mod:`~bootens_core.exact.density`),
Theorems 1-2 and Lemma 1 on particles (:mod:`~bootens_core.exact.theory`)."""
