"""The optimizers of the paper's experiments as optax transformations that minimise ``-log p~``
(:func:`optimizer`), each with what decides its compiled programs (:meth:`Optimizer.program_key`).

The optax optimizers carry their learning rate (and Adagrad its accumulator settings) as data in their state
(``optax.inject_hyperparams``): the state made by ``tx.init`` holds it, so optimizers that differ only in
the learning rate share one compiled program, and ``optax.tree.set(state, learning_rate=...)`` changes it
between steps without a new compilation."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import optax

from .compact_lbfgs import compact_lbfgs
from .linesearch import batched_zoom_linesearch

__all__ = ["Optimizer", "optimizer"]

# The L-BFGS directions: optax.lbfgs with its two-loop recursion, or the same in compact form (compact_lbfgs:
# two reads of the history per iteration instead of a gather per stored pair under vmap).
_DIRECTIONS = {"compact": compact_lbfgs, "two-loop": optax.lbfgs}

# The ensembles' zoom line search: optax.lbfgs's own (zoom, up to 20 steps, initial guess 1), batched per
# branch over the particles (one object: it is a static argument of the compiled programs).
_ZOOM = batched_zoom_linesearch(20, "one")


class Optimizer(NamedTuple):
    """An optax transformation that minimises ``-log p~``, and whether it needs the loss value.

    ``iterations_per_step``: how many optimizer iterations one ``update`` -- one step of :func:`train` --
    makes at most: 1 for every optax optimizer (one update = one iteration), ``max_iter`` for
    ``"torch-lbfgs"`` (one update = one ``torch.optim.LBFGS.step(closure)``, an outer step of up to
    ``max_iter`` iterations). :meth:`steps_for` turns an iteration budget into :func:`train`'s ``steps``.
    ``signature``: a hashable description of the program ``tx`` compiles to (:func:`optimizer` sets its name
    and the settings that are not data; the learning rate of an optax optimizer is not part of it): optimizers
    with equal signatures share compiled programs; ``None`` (a transformation of one's own): ``tx`` itself
    identifies them.
    """

    tx: optax.GradientTransformation
    needs_value: bool
    description: str
    iterations_per_step: int = 1
    signature: Any = None

    def program_key(self) -> Any:
        """What decides the programs compiled for this optimizer: its signature, else ``tx`` itself."""
        return (self.tx if self.signature is None else self.signature, self.needs_value, self.iterations_per_step)

    def steps_for(self, iterations: int) -> int:
        """The ``steps`` of :func:`train` that make ``iterations`` iterations: ``iterations / iterations_per_step``.

        Raises ``ValueError`` unless ``iterations`` is a non-negative multiple of ``iterations_per_step``
        (e.g. 640 iterations are 640 steps of optax's L-BFGS but 32 outer steps of ``torch-lbfgs`` with
        ``max_iter=20``; 630 cannot be split into whole outer steps of 20).
        """
        per = int(self.iterations_per_step)
        if isinstance(iterations, bool) or int(iterations) != iterations or iterations < 0:
            raise ValueError(f"iterations must be a non-negative integer, got {iterations!r}")
        if int(iterations) % per:
            raise ValueError(
                f"{int(iterations)} iterations are not a whole number of steps of {self.description}: one step "
                f"makes up to {per} iterations"
            )
        return int(iterations) // per


def optimizer(name: str, learning_rate: float, **kwargs: Any) -> Optimizer:
    """Build one of the optimizers of the paper's experiments.

    Args:
        name: ``"sgd"`` (plain gradient ascent on ``log p~``, Algorithm 1 as written), ``"adagrad"``
            (kwargs ``initial_accumulator_value`` (optax default 0.1), ``eps``), ``"adam"``, ``"lbfgs"``
            (optax's L-BFGS, one iteration per step; kwargs ``memory_size`` (default 10) and ``linesearch``:
            ``None`` for fixed steps of size ``learning_rate`` along the L-BFGS direction, or ``"zoom"`` for
            optax's zoom line search; ``direction``: ``"compact"`` (default,
            :func:`~bootens_core.ensemble.compact_lbfgs.compact_lbfgs`: the inverse-Hessian product from the
            compact representation, two passes over the history) or ``"two-loop"`` (``optax.lbfgs``'s
            recursion; the same direction up to float rounding)), or ``"torch-lbfgs"``
            (``torch.optim.LBFGS(lr=learning_rate, ...)``,
            :func:`bootens_core.ensemble.lbfgs.torch_lbfgs`: **one step is one outer** ``.step(closure)`` of up to
            ``max_iter`` iterations -- ``iterations_per_step = max_iter``; kwargs as torch's: ``max_iter``
            (20), ``max_eval``, ``tolerance_grad``, ``tolerance_change``, ``history_size`` (100),
            ``line_search_fn`` (``None``: fixed step; ``"strong_wolfe"``) and ``max_ls``).
        learning_rate: the step size ``h``. The optax optimizers (all but ``"torch-lbfgs"``) keep it, and their
            other numeric settings, as data in the state ``tx.init`` makes (``optax.inject_hyperparams``): the
            state decides the rate, so optimizers that differ only in it share one compiled program, and
            ``optax.tree.set(opt_state, learning_rate=r)`` changes it between steps (``r`` a scalar, or one rate
            per particle in an ensemble's state).

    Raises:
        ValueError: for an unknown name or line search, or a bad learning rate or torch option;
        TypeError: for an option the optimizer does not take.
    """
    lr = float(learning_rate)
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"learning rate must be a positive finite number, got {learning_rate!r}")
    # The optax optimizers hold the learning rate in their state (data); torch-lbfgs compiles it in.
    static_lr = (lr,) if name == "torch-lbfgs" else ()
    try:
        signature = (name, *static_lr, tuple(sorted(kwargs.items())))
        hash(signature)
    except TypeError:  # an unhashable option value: the transformation object identifies the programs
        signature = None
    return _optimizer(name, lr, kwargs)._replace(signature=signature)


def _optimizer(name: str, lr: float, kwargs: dict[str, Any]) -> Optimizer:
    if name == "sgd":
        _no_extra(name, kwargs)
        return Optimizer(optax.inject_hyperparams(optax.sgd)(lr), False, f"gradient ascent, h={lr:g}")
    if name == "adagrad":
        acc = float(kwargs.pop("initial_accumulator_value", 0.1))
        eps = float(kwargs.pop("eps", 1e-7))
        _no_extra(name, kwargs)
        return Optimizer(
            optax.inject_hyperparams(optax.adagrad)(lr, initial_accumulator_value=acc, eps=eps), False,
            f"Adagrad, h={lr:g}, initial accumulator {acc:g}",
        )
    if name == "adam":
        _no_extra(name, kwargs)
        return Optimizer(optax.inject_hyperparams(optax.adam)(lr), False, f"Adam, lr={lr:g}")
    if name == "lbfgs":
        memory = int(kwargs.pop("memory_size", 10))
        search = kwargs.pop("linesearch", None)
        direction = kwargs.pop("direction", "compact")
        _no_extra(name, kwargs)
        if direction not in _DIRECTIONS:
            raise ValueError(f"unknown L-BFGS direction {direction!r}: use 'compact' or 'two-loop'")
        lbfgs = optax.inject_hyperparams(_DIRECTIONS[direction], static_args=("memory_size", "linesearch"))
        if search is None:
            tx = lbfgs(learning_rate=lr, memory_size=memory, linesearch=None)
            desc = f"L-BFGS (memory {memory}), fixed step {lr:g}, no line search"
        elif search == "zoom":
            tx = lbfgs(learning_rate=lr, memory_size=memory, linesearch=_ZOOM)
            desc = f"L-BFGS (memory {memory}), zoom line search, initial step {lr:g}"
        else:
            raise ValueError(f"unknown L-BFGS line search {search!r}: use None or 'zoom'")
        if direction == "two-loop":
            desc += ", two-loop recursion"
        # Only the line search reads the loss value (and caches value and gradient in the state).
        return Optimizer(tx, search is not None, desc)
    if name == "torch-lbfgs":
        from .lbfgs import torch_lbfgs

        names = ("max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size", "line_search_fn",
                 "max_ls")
        opts = {k: kwargs.pop(k) for k in names if k in kwargs}
        _no_extra(name, kwargs)
        tx = torch_lbfgs(lr, **opts)  # validates the options (ValueError naming the bad one)
        max_iter = int(opts.get("max_iter", 20))
        history = int(opts.get("history_size", 100))
        search = opts.get("line_search_fn")
        how = "fixed step" if search is None else "strong Wolfe line search, initial step"
        desc = (f"torch.optim.LBFGS (history {history}), {how} {lr:g}, up to {max_iter} iterations per step")
        # Every step starts from a loss value and gradient; with strong Wolfe the state caches them.
        return Optimizer(tx, True, desc, max_iter)
    raise ValueError(f"unknown optimizer {name!r}: choose sgd, adagrad, adam, lbfgs or torch-lbfgs")


def _no_extra(name: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(f"optimizer {name!r} does not take {sorted(kwargs)}")
