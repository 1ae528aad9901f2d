"""torch.optim.LBFGS itself (2.13.0+cpu) on every particle of one UCI cell's final fit: the loss and gradient
come from JAX (the same perturbed log joint), torch does the optimisation. Counts the particles that end
non-finite. Usage (torch installed; BOOTENS_DATA_DIR as for the package):
    python torch_itself.py DATASET SPLIT LAYERS SIGMA2_STD_UNITS HISTORY float64|float32 > result.json
Uses the UCI harness's internal cell key and network builder, so the particles are those of the cells of the
records beside this folder (same key, same perturbations, same start)."""
import json, sys, time
import numpy as np
import torch
import jax, jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from bootens_core import ensemble
from bootens_core.config import UCIConfig
from bootens_core.data import uci as ud
from bootens_core.experiments import uci
from bootens_core.harness import Cell
from bootens_core.perturb import perturbed_log_joint

ds, split, layers, nv, hist, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
jax.config.update("jax_enable_x64", dtype == "float64")  # else JAX would compute float64 inputs in float32
DT = jnp.float64 if dtype == "float64" else jnp.float32
TDT = torch.float64 if dtype == "float64" else torch.float32
cfg = UCIConfig()
d = ud.load(ds, split)
_, k_fit = jax.random.split(uci._cell_key(jax.random.key(cfg.seed), Cell(ds, split, f"ensemble-{layers}")))
model = uci._mlp(d.x_train.shape[1], layers, cfg.width, cfg.weight_var, cfg.bias_var, cfg.scale_by_fan_in)
x = jnp.asarray(d.x_train, DT); y = jnp.asarray(d.y_train, DT); nvj = jnp.asarray(nv, DT)
opt = ensemble.optimizer("torch-lbfgs", 0.5, history_size=hist)
state, pert = ensemble.init(k_fit, model, y, nvj, cfg.n_particles, opt)
_, unravel = ravel_pytree(jax.tree.map(lambda a: a[0], state.params))

@jax.jit
def loss_grad(w, p):
    return jax.value_and_grad(lambda v: -perturbed_log_joint(model, unravel(v), x, p, nvj))(w)

k = cfg.n_particles
diverged, finals, t0 = [], [], time.perf_counter()
for i in range(k):
    p_i = jax.tree.map(lambda a: a[i], pert)
    w0 = np.asarray(ravel_pytree(jax.tree.map(lambda a: a[i], state.params))[0])
    param = torch.nn.Parameter(torch.tensor(w0, dtype=TDT))
    o = torch.optim.LBFGS([param], lr=0.5, history_size=hist)
    def closure():
        f, g = loss_grad(jnp.asarray(param.detach().numpy()), p_i)
        param.grad = torch.tensor(np.asarray(g), dtype=TDT)
        return torch.tensor(float(f), dtype=TDT)
    with np.errstate(all="ignore"):
        for _ in range(32):
            o.step(closure)
    w = param.detach().numpy()
    bad = not np.all(np.isfinite(w))
    diverged.append(bad)
    finals.append(float("nan") if bad else float(loss_grad(jnp.asarray(w), p_i)[0]))
out = {"dataset": ds, "split": split, "layers": layers, "noise_var": nv, "history": hist, "dtype": dtype,
       "torch": torch.__version__, "diverged": int(sum(diverged)), "diverged_particles": [i for i, b in enumerate(diverged) if b],
       "final_loss_median": float(np.nanmedian(finals)), "seconds": time.perf_counter() - t0}
print(json.dumps(out), flush=True)
