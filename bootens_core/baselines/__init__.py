"""The baselines: the paper's Gaussian processes (:mod:`~bootens_core.baselines.gp`, GPflow) and Monte Carlo
dropout (:mod:`~bootens_core.baselines.dropout`), and deep ensembles (:mod:`~bootens_core.baselines.deep_ensemble`,
Lakshminarayanan et al., 2017: independently trained networks with adversarial training), which the paper
cites as an ensemble that perturbs the data."""
