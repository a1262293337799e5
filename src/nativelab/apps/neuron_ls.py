"""`neuron-ls` (Lab 0 step 0-1): the guide's device table, for the emulated device.

The cores are the ones the device's runtime serves (NEURON_RT_NUM_CORES / NEURON_RT_VIRTUAL_CORE_SIZE, read by
the runtime at `import torch`), the memory is what the runtime accounts per core, and the CPU affinity is the
host CPUs this process may run on: the emulated cores compute there. Where AWS's own `neuron-ls` exists (the
aws-neuronx-tools package, /opt/aws/neuron/bin, or another `neuron-ls` on PATH) this one runs it instead.
"""

from __future__ import annotations

import os
import shutil
import sys

INSTANCE_TYPE = "trn2.3xlarge"  # what the device emulates: one Trainium2 chip (config.PHYSICAL_CORES, HBM_GB)
AWS_TOOL = "/opt/aws/neuron/bin/neuron-ls"
HEADERS = (("NEURON", "DEVICE"), ("NEURON", "CORES"), ("NEURON", "CORE IDS"), ("NEURON", "MEMORY"),
           ("PCI", "BDF"), ("CPU", "AFFINITY"), ("NUMA", "NODE"))


def _is_ours(path: str) -> bool:
    """A console script pip wrote for this module (ours, from this or another environment): not AWS's tool."""
    try:
        if os.path.samefile(path, sys.argv[0]):
            return True
    except OSError:  # argv[0] is no file (python -c)
        pass
    try:
        with open(path, "rb") as f:
            return b"nativelab" in f.read(4096)
    except OSError:
        return False


def real_tool() -> str | None:
    """AWS's neuron-ls, if this machine has it: its install location first, then PATH (skipping ours)."""
    if os.access(AWS_TOOL, os.X_OK):
        return AWS_TOOL
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("neuron-ls", path=folder or ".")
        if found and not _is_ours(found):
            return found
    return None


def ranges(ids) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the tool's notation for core and CPU lists)."""
    ids, out = sorted(ids), []
    for i in ids:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out) or "-"


def _parse_ranges(text: str) -> set[int]:
    ids = set()
    for part in filter(None, text.strip().split(",")):
        a, _, b = part.partition("-")
        ids.update(range(int(a), int(b or a) + 1))
    return ids


def numa_nodes(cpus: set[int]) -> str:
    """The NUMA nodes holding these CPUs, from sysfs ('-' where the kernel does not say)."""
    root, nodes = "/sys/devices/system/node", []
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit())
        for name in names:
            with open(os.path.join(root, name, "cpulist")) as f:
                if _parse_ranges(f.read()) & cpus:
                    nodes.append(int(name[4:]))
    except (OSError, ValueError):
        return "-"
    return ranges(nodes)


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(h[0]), len(h[1]), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([rule, line(h[0] for h in HEADERS), line(h[1] for h in HEADERS), rule,
                      *(line(r) for r in rows), rule])


def _gb(nbytes: int) -> str:
    return f"{round(nbytes / (1 << 30), 1):g} GB"


def report() -> str:
    import torch  # the emulated device registered at `import nativelab`, its runtime reading NEURON_RT_* then

    from ..device import config, cpu_info

    n = torch.neuron.device_count()
    per_core = [torch.neuron.get_device_properties(i).total_memory for i in range(n)]
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    lnc = config.virtual_core_size()
    row = ("0", str(n), ranges(range(n)), _gb(sum(per_core)), "-", ranges(cpus), numa_nodes(cpus))
    return "\n".join([
        f"nativelab: the neuron device is emulated on the host CPU: {cpu_info.describe()}",
        f"instance-type: {INSTANCE_TYPE}",
        table([row]),
        f"{n} logical NeuronCores (NEURON_RT_VIRTUAL_CORE_SIZE={lnc}: {lnc} physical per logical core), "
        f"{_gb(per_core[0]) if per_core else '0 GB'} accounted per core; no PCI device: the cores compute on "
        f"CPUs {ranges(cpus)}",
    ])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    real = real_tool()
    if real is not None:
        os.execv(real, [real, *argv])  # AWS's tool, with the user's arguments: it knows the real chip
    if argv:
        print(f"neuron-ls: {' '.join(argv)!r}: the emulated device's neuron-ls takes no arguments", file=sys.stderr)
        return 2
    from ..device import real_neuron_installed

    if real_neuron_installed():
        print("neuron-ls: torch_neuronx is installed, so `neuron` is the real device, but AWS's neuron-ls is "
              f"not on PATH (it comes with aws-neuronx-tools, in {os.path.dirname(AWS_TOOL)})", file=sys.stderr)
        return 1
    try:
        print(report(), flush=True)
    except BrokenPipeError:  # `neuron-ls | head`: the reader left; say nothing more, as coreutils do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
