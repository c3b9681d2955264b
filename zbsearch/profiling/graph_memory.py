"""Which tensors a layer's autograd graph holds, by storage: shared by the profiler's memory measurements
(measure.py, measure_recompute.py). Importing this module needs torch."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors(v)


def needed_for_W(groups: Sequence[dict[str, Any]], static: set[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Storages (pointer -> bytes) W still needs after I: the saved inputs of the parameter-using
    autograd nodes, and the output gradients I stored for them."""
    needed: dict[int, int] = {}
    grads: dict[int, int] = {}
    for group in groups:
        for node in group.get("intermediates", ()):
            for attr in dir(node):
                if not attr.startswith("_saved_"):
                    continue
                try:
                    value = getattr(node, attr)
                except RuntimeError:
                    continue
                for t in tensors(value):
                    ptr, nbytes = storage_key(t)
                    if nbytes and ptr not in static:
                        needed[ptr] = nbytes
        for grad_tuple in group.get("grads", None) or ():
            for t in tensors(grad_tuple):
                ptr, nbytes = storage_key(t)
                if nbytes:
                    grads[ptr] = nbytes
    return needed, grads
