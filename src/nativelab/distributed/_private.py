"""Private PyTorch APIs the `neuron` process group relies on, each in one place (canaries in
tests/test_private_apis.py): c10d calls a Python process group by private method names."""

from __future__ import annotations

import torch.distributed as dist


class PythonProcessGroup(dist.ProcessGroup):
    """`dist.ProcessGroup` with the private methods c10d calls on a group written in Python, each answered by the
    subclass's public method of the same meaning."""

    def _get_backend_name(self) -> str:
        return self.name()

    def _set_group_name(self, name: str) -> None:
        self.set_group_name(name)

    def _set_group_desc(self, desc: str) -> None:
        self.set_group_desc(desc)

    def _get_backend(self, device=None):
        return self.backend(device)

    def _set_sequence_number_for_group(self) -> None:
        self.set_sequence_number_for_group()

    def _allgather_base(self, *args, **kwargs):  # all_gather_single's name before PyTorch 2.12
        return self.all_gather_single(*args, **kwargs)

    def _reduce_scatter_base(self, *args, **kwargs):
        return self.reduce_scatter_single(*args, **kwargs)

    def _start_coalescing(self, device) -> None:
        self.start_coalescing(device)

    def _end_coalescing(self, device):
        return self.end_coalescing(device)


def set_sequence_number_for_group(backend) -> None:
    """Have a C++ backend (gloo) agree on its collective sequence numbers with the group's other ranks."""
    backend._set_sequence_number_for_group()
