"""The derivative formulas of PyTorch 2.13 that make zero tensors (`aten._efficientzerotensor`), and a run of each
on the device against CPU (used by test_zero_tensors.py, in a subprocess).

How they were found (`find()` below, re-run by the slow test so the lists stay true): every OpInfo op that
supports autograd, its fp32 CPU samples, under a dispatch mode that watches for `_efficientzerotensor`:
- reverse mode, first derivatives (8 samples per op): only `sgn` (FunctionsManual's sgn_backward for real inputs);
- reverse mode, second derivatives: the ops whose first derivative calls sgn (abs, the norms, l1-type losses ...);
- forward mode, a tangent on the first differentiable input only: every formula with another differentiable input,
  whose missing tangent the generated code makes an efficient zero tensor (gen_variable_type.py, `zeros_fn`).
derivatives.yaml itself never names `_efficientzerotensor`: it comes from FunctionsManual.cpp and the codegen.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

REVERSE = ("sgn",)
GRADGRAD = (
    "abs", "linalg.norm", "linalg.vector_norm", "masked.normalize", "nn.functional.l1_loss",
    "nn.functional.normalize", "nn.functional.pairwise_distance", "nn.functional.smooth_l1_loss",
    "nn.functional.softsign", "norm", "renorm", "special.i0e", "special.i1e",
)
# (name, variant); forward mode, tangent on the first differentiable input
FORWARD = tuple(tuple(x) for x in json.loads("""[
["add",""],["clamp_max",""],["clamp_min",""],["mul",""],["sub",""],["addmm",""],["addmm","decomposed"],["addmv",""],
["addbmm",""],["baddbmm",""],["dot",""],["vdot",""],["bmm",""],["mv",""],["addr",""],["addcmul",""],["addcdiv",""],
["atan2",""],["block_diag",""],["cholesky_solve",""],["clamp",""],["complex",""],["corrcoef",""],["cov",""],
["cross",""],["div","no_rounding_mode"],["div","trunc_rounding"],["div","floor_rounding"],["true_divide",""],
["diagonal_scatter",""],["fmax",""],["fmin",""],["fmod",""],["remainder",""],["logaddexp",""],["logaddexp2",""],
["lu_solve",""],["masked_scatter",""],["matmul",""],["quantile",""],["nanquantile",""],["max","binary"],
["maximum",""],["min","binary"],["minimum",""],["_softmax_backward_data",""],
["nn.functional.linear_cross_entropy",""],["as_strided_scatter",""],["native_group_norm",""],
["native_batch_norm",""],["_native_batch_norm_legit",""],["_batch_norm_with_update",""],
["nn.functional.cosine_similarity",""],["nn.functional.binary_cross_entropy_with_logits",""],
["nn.functional.conv_transpose1d",""],["nn.functional.conv_transpose2d",""],["nn.functional.conv_transpose3d",""],
["nn.functional.conv1d",""],["nn.functional.conv2d",""],["nn.functional.conv3d",""],["nn.functional.group_norm",""],
["nn.functional.instance_norm",""],["nn.functional.layer_norm",""],["nn.functional.rms_norm",""],
["nn.functional.local_response_norm",""],["nn.functional.margin_ranking_loss",""],
["nn.functional.multilabel_soft_margin_loss",""],["max_pool2d_with_indices_backward",""],
["nn.functional.linear",""],["nn.functional.bilinear",""],["nn.functional.prelu",""],["nn.functional.rrelu",""],
["nn.functional.softsign",""],["nn.functional.triplet_margin_loss",""],
["nn.functional.triplet_margin_with_distance_loss",""],["nn.functional.batch_norm",""],
["nn.functional.batch_norm","without_cudnn"],["nn.functional.binary_cross_entropy",""],["mm",""],["dist",""],
["outer",""],["pow",""],["float_power",""],["sgn",""],["__radd__",""],["__rdiv__",""],["__rmul__",""],
["__rmatmul__",""],["__rmod__",""],["__rpow__",""],["__rsub__",""],["rsub",""],["select_scatter",""],
["slice_scatter",""],["triangular_solve",""],["lerp",""],["svd_lowrank",""],["pca_lowrank",""],["polar",""],
["column_stack",""],["index_copy",""],["_unsafe_masked_index_put_accumulate",""],["index_put",""],["put",""],
["scatter",""],["scatter_add",""],["hstack",""],["hypot",""],["cat",""],["vstack",""],["dstack",""],["trapz",""],
["trapezoid",""],["cumulative_trapezoid",""],["xlogy",""],["kron",""],["inner",""],["tensordot",""],
["nn.functional.smooth_l1_loss",""],["nn.functional.l1_loss",""],["logdet",""],["where",""],
["nn.functional.multi_head_attention_forward",""],["nn.functional.mse_loss",""],["nanmean",""],
["nn.functional.cosine_embedding_loss",""],["nn.functional.gaussian_nll_loss",""],
["nn.functional.hinge_embedding_loss",""],["nn.functional.huber_loss",""],["nn.functional.poisson_nll_loss",""],
["nn.functional.pairwise_distance",""],["nn.functional.kl_div",""],["scatter_reduce","sum"],
["scatter_reduce","mean"],["scatter_reduce","amin"],["scatter_reduce","amax"],["linalg.cross",""],
["linalg.vecdot",""],["linalg.householder_product",""],["linalg.lstsq","grad_oriented"],["linalg.multi_dot",""],
["linalg.slogdet",""],["linalg.vander",""],["linalg.lu_solve",""],["linalg.solve",""],["linalg.solve_ex",""],
["linalg.solve_triangular",""],["linalg.pinv","singular"],["linalg.tensorsolve",""],["special.xlog1py",""],
["masked.cumsum",""],["masked.cumprod",""],["masked.mean",""],["masked.var",""],["masked.std",""],
["masked.normalize",""],["masked.logaddexp",""]
]"""))
# Forward-mode formulas that make the CPU itself crash (segfault) with a zero tangent in torch 2.13: no reference
# exists to compare against; the probe leaves them out (test_zero_tensors checks them against their formulas).
CPU_CRASHES = {"ldexp", "index_add"}


class ZeroTensorWatch(TorchDispatchMode):
    """Records whether `_efficientzerotensor` ran inside it."""

    def __init__(self):
        super().__init__()
        self.made = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._efficientzerotensor.default:
            self.made = True
        return func(*args, **(kwargs or {}))


def _ops():
    from torch.testing._internal.common_methods_invocations import op_db

    return {(op.name, op.variant_test_name): op for op in op_db}


def _leaves(sample):
    return [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
            if isinstance(t, torch.Tensor) and t.requires_grad]


def _outputs(out):
    return [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]


def _first_sample(op, device, dtype=torch.float32):
    return next(iter(op.sample_inputs(device, dtype, requires_grad=True)))


def _to(sample, device):
    def move(t):
        if isinstance(t, torch.Tensor):
            return t.detach().to(device).requires_grad_(t.requires_grad)
        return t
    return tree_map(move, (sample.input, sample.args, sample.kwargs))


def reverse(op, inp, args, kwargs, order: int):
    """Gradients (order 1) or second derivatives (order 2) of the outputs' sums w.r.t. the inputs; and whether a
    zero tensor was made on the way."""
    leaves = _leaves(type("S", (), {"input": inp, "args": args, "kwargs": kwargs}))
    outs = _outputs(op(inp, *args, **kwargs))
    watch = ZeroTensorWatch()
    if order == 1:
        with watch:
            grads = torch.autograd.grad([o.sum() for o in outs], leaves, allow_unused=True)
        return grads, watch.made
    grads = torch.autograd.grad([o.sum() for o in outs], leaves, allow_unused=True, create_graph=True)
    grads = [g for g in grads if g is not None and g.requires_grad]
    with watch:
        grads2 = torch.autograd.grad([g.sum() for g in grads], leaves, allow_unused=True)
    return grads2, watch.made


def forward(op, inp, args, kwargs):
    """The outputs' tangents with a tangent (ones) on the first differentiable input only; and whether a zero
    tensor was made on the way."""
    import torch.autograd.forward_ad as fwad

    watch = ZeroTensorWatch()
    with fwad.dual_level():
        first = [True]

        def dual(t):
            if isinstance(t, torch.Tensor) and t.requires_grad and first[0]:
                first[0] = False
                return fwad.make_dual(t.detach(), torch.ones_like(t))
            return t.detach() if isinstance(t, torch.Tensor) else t

        inp, args, kwargs = tree_map(dual, (inp, args, kwargs))
        with watch:
            out = op(inp, *args, **kwargs)
        tangents = [fwad.unpack_dual(o).tangent for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
    return tangents, watch.made


def _run(op, mode: str, device: str, index: int = 0):
    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=True)
    sample = next(s for i, s in enumerate(samples) if i == index)
    inp, args, kwargs = _to(sample, device)
    if mode == "forward":
        return forward(op, inp, args, kwargs)
    return reverse(op, inp, args, kwargs, 1 if mode == "reverse" else 2)


def _making_sample(op, mode: str) -> int:
    """The first of the op's samples (up to 8, as find() tries them) whose formula makes a zero tensor on CPU."""
    for i in range(8 if mode != "forward" else 1):
        try:
            if _run(op, mode, "cpu", i)[1]:
                return i
        except (StopIteration, RuntimeError):
            pass
    return 0


def cases():
    return ([("reverse", n, "") for n in REVERSE] + [("gradgrad", n, "") for n in GRADGRAD]
            + [("forward", n, v) for n, v in FORWARD])


def compare(device: str = "neuron") -> dict:
    """Each case on CPU and on the device (the CPU sample moved there): {case: None | what differed}."""
    ops, results = _ops(), {}
    for mode, name, variant in cases():
        op = ops[(name, variant)]
        key = f"{mode}:{name}" + (f".{variant}" if variant else "")
        try:
            index = _making_sample(op, mode)
            want, made = _run(op, mode, "cpu", index)
            got, _ = _run(op, mode, device, index)
            problem = None if made else "no zero tensor on CPU any more: the lists need a refresh (find())"
            for w, g in zip(want, got):
                if (w is None) != (g is None):
                    problem = f"defined on one side only: cpu {w is not None}, device {g is not None}"
                elif w is not None and not op.name.endswith(("rrelu", "lowrank")):  # random: values differ
                    g = g.cpu()
                    if g.shape != w.shape or not torch.allclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True):
                        problem = f"values differ: max |diff| {(g.double() - w.double()).abs().max().item():.3g}"
                elif w is not None and g.shape != w.shape:
                    problem = f"shapes differ: {tuple(g.shape)} vs {tuple(w.shape)}"
            results[key] = problem
        except Exception as e:  # noqa: BLE001 - reported per case
            results[key] = f"{type(e).__name__}: {str(e)[:300]}"
    return results


def find() -> tuple[set, set, set]:
    """The probe that found the lists: (reverse, gradgrad, forward (name, variant)) on CPU."""
    rev, gg, fwd = set(), set(), set()
    for (name, variant), op in _ops().items():
        if not op.supports_autograd:
            continue
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:8]
        except Exception:  # noqa: BLE001 - an op whose samples cannot be made here
            continue
        for i, s in enumerate(samples):
            if not _leaves(s):
                continue
            for order, found in ((1, rev),) + (((2, gg),) if op.supports_gradgrad else ()):
                try:
                    if reverse(op, s.input, s.args, s.kwargs, order)[1]:
                        found.add(name)
                except Exception:  # noqa: BLE001 - a formula that does not apply to this sample
                    pass
            if i == 0 and op.supports_forward_ad and name not in CPU_CRASHES:
                try:
                    if forward(op, s.input, s.args, s.kwargs)[1]:
                        fwd.add((name, variant))
                except Exception:  # noqa: BLE001
                    pass
    return rev, gg, fwd


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    if sys.argv[1:] == ["find"]:
        r, g, f = find()
        print(json.dumps({"reverse": sorted(r), "gradgrad": sorted(g), "forward": sorted(f)}))
    else:
        import nativelab  # noqa: F401

        print(json.dumps(compare()))
