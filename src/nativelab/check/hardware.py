"""Trainium2 figures for the first-order estimate, each with where it is published, and the one fitted constant;
each is a parameter (override it: `Trainium2(graph_launch_s=...)`, `nativelab check --param graph_launch_s=...`).

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

Time outside the kernels (the host, the runtime, the boundaries between kernels). Each figure is a published
measurement, named where it is defined below; one constant, host_step_s, is fitted:
- graph_launch_s = 180 us: one launch of a compiled graph (a NEFF) by the runtime, synchronously, as
  TorchNeuron runs it. aws-neuron-sdk#1370 (https://github.com/aws-neuron/aws-neuron-sdk/issues/1370, Neuron
  2.31, Llama-3.1-8B decode through the PJRT C API): "approximately 13 us between calls with Neuron 2.30 and
  170-190 us with Neuron 2.31", 2.31 having removed the asynchronous queue; the middle of that range. A library
  kernel launched on its own (outside a graph) is its own NEFF: one graph launch.
- eager_launch_s = 215 us: one eager op (each its own small graph and runtime execution). AWS gives no per-op
  figure for TorchNeuron's eager mode (searched: the TorchNeuron overview, best-practices and torch.compile
  pages, the runtime pages); this is the median per-op execute time AWS measured for eager (debug) mode on Trn1
  with PyTorch/XLA (https://github.com/pytorch/xla/pull/3306, "XrtExecute ... 50%=214.762us" over 68,993 op
  executions of BERT-large), the only public per-op figure of a Neuron eager stack found.
- dma_fixed_s = 1.3 us: the fixed cost of one DMA, its "semaphore-to-start latency (~1300 ns cross-engine)"
  (nki/deep-dives/nki-dma-bandwidth-guide.rst,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-dma-bandwidth-guide.html). A kernel
  boundary inside a graph is an HBM write by one kernel and a load by the next (a kernel's inputs and outputs
  live in HBM: aws-neuron/nki-samples#59): kernel_boundary_s = 2 x dma_fixed_s; the bytes are in the roofline.
- instruction_s = 189 ns: the fixed cost of one engine instruction: tiny dependent ScalarE instructions issue
  every 189 ns (264 cycles) on NeuronCore-v2 (nki/deep-dives/nki_perf_guide.rst,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki_perf_guide.html; "a static
  instruction overhead in the order of ~100 cycles"). Charged once per op of a graph or of a library kernel.
- host_round_trip_s = 73.5 us: device -> host -> device for a CPU fallback or a host sync (the host waits for
  the device, reads, writes back): nki.benchmark on trn2.3xlarge, end-to-end vs NeuronCore p50 439 vs 378 us and
  272 vs 186 us, 61 and 86 us of host work and transfer per run; their mean (a public course write-up,
  https://github.com/xaviergonzalez/asst4-trainium2 `writeup.md`; AWS's nki.benchmark docs say its latency
  includes the host <-> device transfer). A fallback's own CPU work is measured as the emulator runs it: the
  host runs the same ATen CPU kernel.
- host_link_bytes_per_s = 31.5 GB/s: host <-> device bytes beyond the round trip, at PCIe 4.0 x16 (16 GT/s x 16
  lanes, 128b/130b encoding, the PCI-SIG base specification); AWS does not publish the Trn2 host link's
  generation, so this is the lower of the two a Trn2 host could have.
- host_step_s: THE fitted constant: the host's per-token loop (the Python of the generate loop, Dynamo's guards,
  the framework's dispatch and tensor allocations around each step's launches), charged once per generated token.
  Fitted on one measurement, the guide's core tier (435.3 tok/s, compiled, greedy); the guide's base,
  experimental and top-p figures are predictions (`python bench/check_estimate.py` redoes the fit and prints
  them). vllm-neuron's trn2 measurement of a synchronous call's "dispatch overheads, tensor allocations, and
  Python overheads", 437 us beside a 5.18 ms NEFF (vllm-neuron docs/design/framework/async_execution.md), is
  the same kind of cost for one call.
- collective_latency_s = 20 us: the fixed cost of one collective (its CC-core orchestration and synchronisation)
  besides its bytes. Not published; assumed, not fitted (no Lab 2 figure has a collective).
"""

from __future__ import annotations

import dataclasses

GiB = 1 << 30
# The host's per-token loop, fitted so that the estimate of the guide's core tier (small, bf16, compiled, greedy,
# on its NKI kernels, Lab 2's default: one graph launch a token) is its measured 435.3 tok/s:
# `python bench/check_estimate.py --kernels nki --fit-on core` (2-core AMD EPYC Zen 4, AVX-512, 2026-12-07).
# Core is the middle of the three tiers; with it, base's and experimental's predictions are -5% and +6%.
HOST_STEP_S = 1.1747e-3

CITATIONS = {
    "trainium2": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/trainium2_arch.html",
    "trainium2_tflops": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
                        "trainium2.html",
    "neuroncore_v3": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
                     "neuron-core-v3.html",
    "device_memory": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/device-memory.html",
    "trainium2_data_movement": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/"
                               "neuron-hardware/trainium2.html",
    "graph_launch": "https://github.com/aws-neuron/aws-neuron-sdk/issues/1370",
    "eager_launch": "https://github.com/pytorch/xla/pull/3306",
    "dma_fixed": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-dma-bandwidth-guide.html",
    "kernel_boundary": "https://github.com/aws-neuron/nki-samples/issues/59",
    "instruction": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki_perf_guide.html",
    "host_round_trip": "https://github.com/xaviergonzalez/asst4-trainium2 (writeup.md: nki.benchmark on trn2.3xlarge)",
    "host_link": "PCI-SIG PCI Express Base Specification 4.0 (16 GT/s per lane, 128b/130b)",
    "host_step": "fitted: the guide's core tier, 435.3 tok/s (bench/check_estimate.py)",
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
    # outside the kernels: published measurements (see above), and the one fitted constant
    graph_launch_s: float = 180e-6  # aws-neuron-sdk#1370: 170-190 us between synchronous NEFF executions
    eager_launch_s: float = 215e-6  # pytorch/xla#3306: median per-op execute, eager debug mode, Trn1
    dma_fixed_s: float = 1.3e-6  # nki-dma-bandwidth-guide: semaphore-to-start latency of a DMA
    instruction_s: float = 189e-9  # nki_perf_guide: a dependent ScalarE instruction every 189 ns
    host_round_trip_s: float = 73.5e-6  # asst4-trainium2 writeup: nki.benchmark end-to-end minus device, 61-86 us
    host_link_bytes_per_s: float = 31.5e9  # PCIe 4.0 x16
    host_step_s: float = HOST_STEP_S  # THE fitted constant: the guide's core tier, 435.3 tok/s
    collective_latency_s: float = 20e-6  # assumed (no published figure; no Lab 2 figure has a collective)

    @property
    def kernel_boundary_s(self) -> float:
        """One kernel boundary inside a graph: the HBM write of one kernel's result and the next one's load,
        a DMA each; their bytes are in the roofline."""
        return 2 * self.dma_fixed_s

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

    # the figures of time outside the kernels (the fitted one first), each a parameter of `--param NAME=VALUE`
    OUTSIDE_KERNELS = ("host_step_s", "graph_launch_s", "eager_launch_s", "dma_fixed_s", "instruction_s",
                       "host_round_trip_s", "host_link_bytes_per_s", "collective_latency_s")
    FITTED = "host_step_s"

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
        d["kernel_boundary_s"] = self.kernel_boundary_s
        d["fitted"] = {self.FITTED: CITATIONS["host_step"]}
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
