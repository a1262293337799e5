"""Trainium2 figures for the first-order estimate, each with where AWS publishes it, and the unknown ones as
named parameters with stated defaults (override them: `Trainium2(launch_s=...)`, `--param launch_s=...`).

Published (AWS Neuron documentation):
- Trainium2 chip: 8 NeuronCore-v3, 96 GiB HBM in 4 stacks at 2.9 TB/s, 667 BF16 dense TFLOPS, 181 FP32 TFLOPS.
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/trainium2_arch.html (HBM, cores) and
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html (TFLOPS)
- NeuronCore-v3: a systolic TensorEngine of 79 BF16/FP16/TF32 TFLOPS, 28 MiB of on-chip SRAM (SBUF; PSUM 2 MiB).
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/neuron-core-v3.html
- Logical NeuronCores (LNC=2, the trn2 default and the guide's setting): 2 physical cores per logical core, so
  the guide's 4 `neuron:i` each get 2/8 of the chip's HBM bandwidth, FLOPS and memory.
- Data movement: 3.5 TB/s of DMA bandwidth per chip; NeuronLink-v3 device-to-device interconnect 1.28 TB/s per
  chip (the Trainium2 architecture page, "Data Movement" and "NeuronLink" rows). A collective between logical
  cores of one chip moves its bytes by DMA through HBM (each byte read and written once): a rank's share is
  min(DMA, HBM / 2) x lnc / 8 = 362 GB/s; between chips (a group larger than a chip's 4 logical cores) the
  NeuronLink share of the chip's 4 ranks, 320 GB/s, if lower. The bytes a rank sends are the ring algorithm's:
  all_reduce 2(n-1)/n x its buffer, all_gather / reduce_scatter / all_to_all (n-1)/n x the full buffer,
  broadcast / reduce / send / recv the buffer, barrier none.
- Runtime memory: "a micro-code overhead of 96MB per physical Neuron Core" besides tensors (plus scratchpad,
  DMA rings and collective buffers, which depend on the program and are not counted here).
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/device-memory.html

Not published (named parameters, defaults stated and used unless overridden):
- launch_s: one launch of a compiled graph by the runtime, host side included. The one constant
  fitted to the guide: 912 us makes the base tier's estimate equal its measured 359 tok/s (compiled, greedy,
  2.00 graph launches per token: the argmax fallback splits the graph, + 0.04 eager ops); with it core is
  estimated at 542 tok/s (guide 435, +24%) and experimental at 559 (guide 537, +4%).
  `python bench/check_estimate.py` redoes it.
- eager_launch_s: one eager op (not compiled: each op its own small graph and runtime execution). AWS's docs
  give no per-op figure for TorchNeuron's eager mode (searched: the TorchNeuron overview, best-practices and
  torch.compile pages, the runtime pages). Assumed 215 us: the median per-op execute time AWS measured for
  eager (debug) mode on Trn1 with PyTorch/XLA (https://github.com/pytorch/xla/pull/3306, "XrtExecute ... 50%=
  214.762us" over 68,993 op executions of BERT-large), the only public per-op figure of a Neuron eager stack
  found; not fitted (the Lab 2 tiers are compiled). launch_s stays the compiled graph's.
- kernel_s: the fixed cost of one op inside a graph or a library kernel (its engine instructions and their
  synchronisation; its bytes are in the roofline). Default 2 us, not fitted.
- host_round_trip_s: one device -> host -> device round trip of a CPU fallback (a drain, a DMA each way over
  PCIe, the host kernel), besides the bytes.
- host_link_bytes_per_s: host <-> device bandwidth (PCIe Gen5 x16 class).
- collective_latency_s: the fixed cost of one collective (its CC-core orchestration and synchronisation) besides
  its bytes. Default 20 us, not fitted.
"""

from __future__ import annotations

import dataclasses

GiB = 1 << 30

CITATIONS = {
    "trainium2": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/trainium2_arch.html",
    "trainium2_tflops": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
                        "trainium2.html",
    "neuroncore_v3": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
                     "neuron-core-v3.html",
    "device_memory": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/device-memory.html",
    "trainium2_data_movement": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/"
                               "neuron-hardware/trainium2.html",
    "eager_launch": "https://github.com/pytorch/xla/pull/3306",
    "torch_compile": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html",
}


@dataclasses.dataclass
class Trainium2:
    # published, per chip
    hbm_bytes: int = 96 * GiB
    hbm_bytes_per_s: float = 2.9e12
    bf16_flops: float = 667e12
    fp32_flops: float = 181e12
    physical_cores: int = 8
    sbuf_bytes: int = 28 << 20  # per physical core
    microcode_bytes_per_physical_core: int = 96 * 10**6
    lnc: int = 2  # physical cores per logical core (NEURON_RT_VIRTUAL_CORE_SIZE)
    dma_bytes_per_s: float = 3.5e12
    neuronlink_bytes_per_s: float = 1.28e12  # device-to-device, per chip
    # not published: named parameters with stated defaults
    launch_s: float = 912e-6  # THE fitted constant: the guide's base tier (359 tok/s), bench/check_estimate.py
    eager_launch_s: float = 215e-6  # assumed (see above): per eager op
    kernel_s: float = 2.0e-6
    host_round_trip_s: float = 100e-6
    host_link_bytes_per_s: float = 32e9
    collective_latency_s: float = 20e-6

    # per logical core (what one `neuron:i` gets)
    @property
    def core_bytes_per_s(self) -> float:
        return self.hbm_bytes_per_s * self.lnc / self.physical_cores

    @property
    def core_flops(self) -> float:
        return self.bf16_flops * self.lnc / self.physical_cores

    @property
    def core_fp32_flops(self) -> float:
        return self.fp32_flops * self.lnc / self.physical_cores

    @property
    def core_hbm_bytes(self) -> int:
        return self.hbm_bytes * self.lnc // self.physical_cores

    @property
    def runtime_reserve_bytes(self) -> int:
        """The documented part of what the runtime keeps per logical core: its cores' micro-code."""
        return self.microcode_bytes_per_physical_core * self.lnc

    UNPUBLISHED = ("launch_s", "eager_launch_s", "kernel_s", "host_round_trip_s", "host_link_bytes_per_s", "collective_latency_s")

    # -- collectives ----------------------------------------------------------------------------------------

    @property
    def ranks_per_chip(self) -> int:
        return self.physical_cores // self.lnc

    def collective_bytes_per_s(self, world: int) -> float:
        """One rank's collective bandwidth: its share of the chip's DMA (bounded by HBM, each byte read and
        written), and of NeuronLink when the group spans chips."""
        share = self.lnc / self.physical_cores
        bw = min(self.dma_bytes_per_s, self.hbm_bytes_per_s / 2) * share
        if world > self.ranks_per_chip:
            bw = min(bw, self.neuronlink_bytes_per_s / self.ranks_per_chip)
        return bw

    def collective_link_bytes(self, kind: str, nbytes: int, world: int) -> float:
        """The bytes one rank sends for a collective over a buffer of `nbytes` (ring algorithms)."""
        n = max(world, 1)
        factor = _RING.get(kind, 1.0)
        if callable(factor):
            factor = factor(n)
        return factor * nbytes

    def collective_seconds(self, kind: str, nbytes: int, world: int, calls: int = 1) -> float:
        return calls * self.collective_latency_s + \
            self.collective_link_bytes(kind, nbytes, world) / self.collective_bytes_per_s(world)

    def with_params(self, params: dict) -> "Trainium2":
        unknown = set(params) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown Trainium2 parameter(s) {sorted(unknown)}; known: "
                             f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **params)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["per_logical_core"] = {"hbm_bytes_per_s": self.core_bytes_per_s, "bf16_flops": self.core_flops,
                                 "hbm_bytes": self.core_hbm_bytes, "runtime_reserve_bytes": self.runtime_reserve_bytes}
        d["per_logical_core"]["collective_bytes_per_s"] = self.collective_bytes_per_s(self.ranks_per_chip)
        d["unpublished"] = list(self.UNPUBLISHED)
        return d


# Bytes one rank sends, as a multiple of the collective's buffer (the largest tensor argument: the reduced buffer,
# the gathered output, the scattered input), for ring algorithms over n ranks; 1 for the others, 0 for barrier.
_RING = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "barrier": 0.0,
}
