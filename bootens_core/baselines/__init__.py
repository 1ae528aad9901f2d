"""The paper's baselines: Gaussian processes (:mod:`~bootens_core.baselines.gp`, GPflow) and Monte Carlo
dropout (:mod:`~bootens_core.baselines.dropout`)."""
