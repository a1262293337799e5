"""Lab 1, Step 4: a kernel integrated with the @nki_op + wrap_nki pattern, called in eager and compiled mode.

    python labs/lab1/nki_integration.py
"""

import torch

from nativelab.kernels import nki_op, wrap_nki


def nki_add_kernel(a, b, out):
    """The kernel: computes into the output it is given (on Trainium this would be NKI code)."""
    torch.add(a, b, out=out)


add_kernel = wrap_nki(nki_add_kernel)  # traced and compiled once per shape/dtype, cached on disk


@nki_op("nki_lab::add", mutates_args=())
def nki_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(a)
    add_kernel(a, b, out)
    return out


device = torch.device("neuron")
a = torch.randn(128).to(device)
b = torch.randn(128).to(device)

result = nki_add(a, b)
print(f"Eager mode - NKI add result shape: {result.shape}, device: {result.device}")
torch.testing.assert_close(result.cpu(), a.cpu() + b.cpu())

compiled_add = torch.compile(nki_add, backend="neuron")
result = compiled_add(a, b)
print(f"Compiled mode - NKI add result shape: {result.shape}, device: {result.device}")
torch.testing.assert_close(result.cpu(), a.cpu() + b.cpu())
