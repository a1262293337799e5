"""Lab 1, Step 4: an NKI kernel integrated with the @nki_op + wrap_nki pattern, called in eager and compiled mode.

    python labs/lab1/nki_integration.py

The kernel is NKI code, as on Trainium: it loads its inputs from HBM into SBUF tiles, adds them, and stores
the sum into an HBM tensor it returns. nativelab traces it once per shape and dtype, checks it against
NeuronCore-v3's limits, and compiles it (cached on disk, the guide's NKI trace cache).
"""

import torch  # first: importing torch registers the emulated device, and with it `import nki`

import nki  # noqa: E402 - AWS's nki where installed, else nativelab's stand-in (nativelab.nki)
import nki.language as nl  # noqa: E402
from nativelab.kernels import nki_op, wrap_nki  # noqa: E402


@nki.jit
def nki_add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)  # the result, in HBM
    a_tile = nl.load(a)  # HBM -> SBUF (128 partitions)
    b_tile = nl.load(b)
    nl.store(out, nl.add(a_tile, b_tile))  # SBUF -> HBM
    return out


add_kernel = wrap_nki(nki_add_kernel)


@nki_op("nki_lab::add", mutates_args=())
def nki_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return add_kernel(a, b)


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
