"""A finding: one problem at one source line, how often it happened, what it costs and how to fix it."""

from __future__ import annotations

import dataclasses

SEVERITIES = ("error", "warning", "info")

# The kinds, and the --fail-on name that gates each (None: never gates).
KINDS = {
    "fallback": "fallback",            # an op the device does not run: a CPU round trip
    "sync": "sync",                    # the host waits for the device (.item(), printing, branches, dynamic shapes)
    "int64-overflow": "int64-overflow",  # int64 values beyond int32 (the device casts: wrong values, no error)
    "int64-cast": None,                # int64 inputs the device casts to int32 (values fit)
    "int-fp32": "int64-overflow",      # integer matmul / scatter-add / all-reduce computed in fp32 beyond 2^24
    "float64": None,                   # float64 computed in float32
    "recompile": "recompile",          # a new compile (new shape, failed guard)
    "graph-break": "recompile",        # Dynamo split the function
    "compile-option": None,            # an option the real backend rejects or ignores
    "memory": "memory",                # peak device memory against a core's capacity
    "collective": None,                # collective calls, bytes and time
    "bf16-drift": None,                # a bf16 op that adds a large error against float32 (--bf16-drift)
    "eager-launch": None,              # eager op launches are most of the estimate: compile
    "no-device": "no-device",          # nothing reached the device: the program ran on the CPU
    "failure": "failure",              # the program raised or exited with a non-zero status
    "safetensors-device": "fallback",  # safetensors cannot load onto the device by name
}
FAIL_ON = sorted({v for v in KINDS.values() if v})


@dataclasses.dataclass
class Finding:
    kind: str
    severity: str
    title: str  # what happened, e.g. "aten::sort.values_stable falls back to the CPU"
    site: str | None  # "file:line" of the user's code
    line: int | None
    count: int  # occurrences over the checked run
    fix: str
    per_step: float | None = None  # occurrences per step (optimizer step / nativelab.check.step() / token)
    cost_s: float = 0.0  # estimated seconds on Trainium2 over the run (what the report sorts by)
    code: str = ""  # the source line's text
    details: dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _sort_key(f: Finding):
    return (SEVERITIES.index(f.severity), -f.cost_s, -f.count)


def sort(findings: list[Finding]) -> list[Finding]:
    """Errors first, then by estimated cost."""
    return sorted(findings, key=_sort_key)


# -- fixes -------------------------------------------------------------------------------------------------

_SAMPLER = ("sample on the device with nativelab.kernels.ops.sample (temperature / top-k / top-p without sort, "
            "multinomial or a host sync)")

FALLBACK_FIXES = {
    "aten::sort": "argsort / sort -> torch.topk(x, k) (runs on the device) when you need the k largest; for "
                  "top-p sampling (sort + cumsum + multinomial) " + _SAMPLER,
    "aten::argsort": "argsort -> torch.topk(x, k).indices (runs on the device)",
    "aten::multinomial": "sort + multinomial sampling -> " + _SAMPLER,
    "aten::argmax": "argmax -> x.max(dim).indices (aten::max.dim runs on the device) or keep it but outside the "
                    "per-token loop",
    "aten::argmin": "argmin -> x.min(dim).indices, or (-x).max(dim).indices (max.dim runs on the device)",
    "aten::normal_": "random numbers fall back: draw them on the CPU once outside the step and .to('neuron'), or "
                     "reuse a pre-drawn buffer",
    "aten::random_": "random integers (randint) fall back: draw them on the CPU outside the step and .to('neuron')",
    "aten::uniform_": "random numbers fall back: draw them on the CPU outside the step and .to('neuron')",
    "aten::bernoulli_": "dropout masks fall back: disable dropout for inference, or draw masks outside the step",
    "aten::_unique2": "unique has a data-dependent shape: count into a fixed-size histogram "
                      "(one_hot(x, n).sum(0) or index_add) instead",
    "aten::unique_consecutive": "unique has a data-dependent shape: use a fixed-size histogram (one_hot().sum(0))",
    "aten::scatter_add_": "scatter_add_ -> index_add / scatter_add with out= (aten::scatter_add.out runs on the "
                          "device), or one_hot(idx).T @ src",
    "aten::convolution_overrideable": "eager convolutions (and their backward) fall back here: compile the model "
                                      "(torch.compile(model, backend='neuron')) so they run inside a device graph",
    "aten::mse_loss": "F.mse_loss(a, b) / nn.MSELoss() -> ((a - b) ** 2).mean() (reduction='sum': .sum()): sub, pow "
                      "and mean run on the device, forward and backward",
    "aten::smooth_l1_loss": "F.smooth_l1_loss(a, b, beta=b0) -> d = (a - b).abs(); torch.where(d < b0, 0.5 * d ** 2 "
                            "/ b0, d - 0.5 * b0).mean(): abs, where and mean run on the device",
    "aten::huber_loss": "F.huber_loss(a, b, delta=t) -> d = (a - b).abs(); torch.where(d < t, 0.5 * d ** 2, "
                        "t * (d - 0.5 * t)).mean(): abs, where and mean run on the device",
    "aten::binary_cross_entropy": "F.binary_cross_entropy(p, y) -> -(y * p.log().clamp(min=-100) + (1 - y) * "
                                  "(1 - p).log().clamp(min=-100)).mean() (PyTorch's own clamp); from logits z: "
                                  "(F.softplus(z) - y * z).mean()",
    "aten::leaky_relu": "F.leaky_relu(x, s) / nn.LeakyReLU(s) -> torch.where(x > 0, x, s * x): where and mul run on "
                        "the device, forward and backward",
    "aten::native_batch_norm": "BatchNorm in training: m = x.mean((0, 2, 3), keepdim=True); v = x.var((0, 2, 3), "
                               "unbiased=False, keepdim=True); (x - m) * torch.rsqrt(v + eps) * w + b (mean, var, "
                               "rsqrt run on the device; update the running statistics from m and v yourself)",
    "aten::binary_cross_entropy_with_logits": "F.binary_cross_entropy_with_logits(z, y) -> (F.softplus(z) - y * z)"
                                              ".mean(): softplus, mul and mean run on the device",
}


def fallback_fix(op: str) -> str:
    base = op.split(".", 1)[0]
    fix = FALLBACK_FIXES.get(base.replace("_backward_overrideable", "_overrideable").removesuffix("_backward"))
    fix = fix or FALLBACK_FIXES.get(base)
    if fix is None:
        fix = (f"replace {base.split('::')[-1]} with ops the device runs (nativelab/device/native_ops.txt), or move "
               f"it out of the step")
    return fix


SYNC_FIXES = {
    "item": "keep the value on the device (accumulate it in a device tensor) and read it every N steps "
            "(log every N steps)",
    "print": "printing a device tensor waits for the device: print every N steps, or a value accumulated on the "
             "device",
    "tolist": ".tolist() / .cpu() copies to the host and waits: do it once after the loop or every N steps",
    "copy": "a copy to the host waits for the device: keep the value on the device, or copy every N steps",
    "branch": "a Python if / while on a tensor value waits for the device: compute both sides and select with "
              "torch.where, or decide from values already on the host",
    "save": "saving a checkpoint copies every device tensor to the host: expected once per checkpoint; keep it out "
            "of the step (save every N steps)",
    "shape": "a data-dependent shape waits for the device (and recompiles under torch.compile): keep shapes "
             "static, x[mask] -> torch.where(mask, x, 0) / masked_fill (reduce with the mask as weights), "
             "nonzero -> a fixed-size topk",
}



def optimizer_sync_fix(name: str) -> str:
    if ".LBFGS." in name:
        return ("torch.optim.LBFGS decides its line search and convergence on the host: it reads the loss and "
                "gradient norms every inner iteration (max_iter per step), each read a wait for the device. Fewer "
                "inner iterations (max_iter=), or a first-order optimizer (Adam, SGD) whose step stays on the device")
    return (f"{name} reads device values on the host in its step (the optimizer's code, not yours): an optimizer "
            f"whose step stays on the device (Adam, AdamW, SGD), or fewer steps")


INT64_FIX = ("the device casts int64 to int32: values beyond 2^31 wrap with no error. Keep indices below 2^31 "
             "(split the index space, or use offsets per block), and use int32 where values fit")
INT_FP32_FIX = ("integer matmul / scatter-add / all-reduce are computed in fp32 on the device: exact only below "
                "2^24 = 16,777,216. Accumulate in float32/int32 chunks that stay below 2^24, or reduce on the host")
FLOAT64_FIX = "the device computes float64 as float32: use float32 (or bf16) explicitly; keep float64 on the host"
DRIFT_FIX = ("compute this step in float32 (x.float() ... .to(torch.bfloat16)): reductions, variances, a mean "
             "subtracted from large values and long accumulations lose bf16's 8 bits; autocast keeps them in fp32")
COLLECTIVE_FIX = ("overlap collectives with compute (FSDP2 prefetch, async_op=True and wait late), fewer and "
                  "larger ones (bucket gradients), and reduce in bf16 where it is accurate enough")
EAGER_FIX = ("each eager op is one launch on the device, and launches are most of this program's time: compile the "
             "model or the step, model = torch.compile(model, backend=\"neuron\") (Trainium needs backend=\"neuron\"), "
             "so these ops run as one device graph per call; the lines issuing the most are in the details")
EAGER_COMPILED_FIX = ("the program compiles (torch.compile at {site}), and these ops run outside its graphs, one launch "
                      "each: an optimizer's step issues ops per parameter; the fused optimizer runs each group as one "
                      "device op (torch.optim.AdamW(params, fused=True)); other code can go into a compiled function; "
                      "the lines issuing the most are in the details")
NO_DEVICE_FIX = ("select the device and move the model and every batch to it: device = torch.device('neuron') (or "
                 "torch.accelerator.current_accelerator()), model.to(device), x.to(device); a CUDA script as it is: "
                 "nativelab check --device-from cuda script.py")
SAFETENSORS_FIX = ("safetensors does not know the device's name (nor the real device's): load to the CPU, then move: "
                   "tensors = {k: v.to('neuron') for k, v in safetensors.torch.load_file(path).items()}")
BUCKET_FIX = "pad inputs to a few fixed lengths (buckets) so each compiles once"
GRAPH_BREAK_FIX = ("a graph break splits the compiled function into graphs with a host round trip between them: "
                   "remove the Python-side work at that line (print, .item(), data-dependent branch), or "
                   "torch.compile(fullgraph=True) to find them all")
RECOMPILE_FIX = ("each recompile is a new neuronx-cc compile (minutes on the real compiler): keep shapes and "
                 "Python values seen by the compiled function fixed (pad to buckets; pass scalars as tensors)")
