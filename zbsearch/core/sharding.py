"""Static bytes under data-parallel sharding: what a pipeline rank keeps of its layers' parameters,
gradients and optimizer state when a data-parallel group of N ranks shares them.

Per parameter, with weights of w bytes (2 in bf16/fp16, 4 in fp32), mixed precision's fp32 master copy
(4 bytes when w < 4) and the optimizer's state (Adam: two fp32 moments, 8 bytes; SGD with momentum: 4;
none: 0), an unsharded rank holds w + w + master + state bytes (16 with bf16 and Adam). Sharded over N:

- zero1 (ZeRO stage 1): master and state / N; weights and gradients whole.
- zero2 (ZeRO stage 2): gradients, master and state / N; weights whole.
- fsdp (FSDP, ZeRO stage 3; torchtitan's default data parallelism): everything / N, plus what a layer
  gathers while it computes: its whole weights (w bytes per parameter) and, in its backward, its
  whole gradient before the reduce-scatter (w more). A chunk holds the largest such buffer of its layers
  (`gather_bytes`) on top of its shards; this assumes each layer is resharded once it has computed
  (FSDP's reshard after forward), and counts one buffer per chunk, so a rank of a V-shape counts two,
  one more than it holds at once. FSDP's prefetch of the next layer's weights is not counted.
- fsdp-whole-grads (FSDP as torch's pipelining stage runs it with weights resharded after every
  forward and backward): weights, master and state / N, gradients whole: the stage turns gradient sync
  off for every microbatch's backward but the last (torch/distributed/pipelining/stage.py,
  `backward_maybe_with_nosync`: `set_requires_gradient_sync(False)`), so they accumulate unsharded
  until the step's one reduce-scatter. A layer gathers its whole weights while it computes (w bytes per
  parameter; its gradient is whole already).

So with bf16 and Adam a parameter costs 2 + 2 + 12/N (zero1), 2 + 14/N (zero2), 16/N (fsdp) and
2 + 14/N (fsdp-whole-grads, plus the gathered layer) bytes.
The same numbers for ZeRO: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020 (its Figure 1: 2 + 2 + K, K = 12 for mixed-precision Adam).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ProfileError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # bytes of a weight (and an activation element) by dtype
SHARDINGS = ("fsdp", "zero1", "zero2", "fsdp-whole-grads")
OPTIMIZER_STATE_BYTES = {"adam": 8, "sgd": 4, "none": 0}
MAX_DEGREE = 1 << 20


@dataclass(frozen=True)
class ParamBytes:
    """Bytes per parameter by what holds them."""

    weights: int
    grads: int
    master: int
    state: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.state


def param_bytes(weight_bytes: int, optimizer: str) -> ParamBytes:
    """Bytes per parameter of weights of `weight_bytes` under `optimizer` (adam, sgd or none): the
    weight, its gradient, mixed precision's fp32 master copy and the optimizer's state (none keeps no
    master copy either: it holds only the weight and its gradient).

    >>> param_bytes(2, "adam").total, param_bytes(4, "sgd").total, param_bytes(2, "none").total
    (16, 12, 4)
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ProfileError(f"optimizer {optimizer!r} is not known: use one of {', '.join(OPTIMIZER_STATE_BYTES)}")
    if optimizer == "none":
        return ParamBytes(weight_bytes, weight_bytes, 0, 0)
    return ParamBytes(weight_bytes, weight_bytes, 4 if weight_bytes < 4 else 0, OPTIMIZER_STATE_BYTES[optimizer])


def check_devices(devices: int, stages: int, degree: int = 1) -> None:
    """That a job of `devices` GPUs can hold `stages` pipeline stages times `degree` data-parallel shards a
    whole number of times (the other parallel dimensions, tensor, context and replicated data, take the
    rest).

    Raises
    ------
    ProfileError
        The device count is not a positive whole number, or stages x degree does not divide it; the message
        lists the shard degrees that do.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ProfileError(f"device count {devices!r} is out of range: give the number of GPUs in the job, a whole "
                           "number from 1", subject="devices")
    if devices % (stages * degree):
        fits = [d for d in range(1, devices // stages + 1) if (devices // stages) % d == 0] if devices % stages == 0 else []
        fix = (f"use a data-parallel shard degree that divides {devices // stages} ({', '.join(map(str, fits))})"
               if fits else f"use a device count that is a multiple of {stages * degree}")
        what = f"{stages} pipeline stages" + (f" x {degree} data-parallel shards" if degree > 1 else "")
        raise ProfileError(f"device count {devices} does not allow {what} ({stages * degree} GPUs per copy does not "
                           f"divide {devices}): {fix}", subject="devices")


@dataclass(frozen=True)
class Sharding:
    """A data-parallel group of `degree` ranks sharing each pipeline rank's static bytes, as `how`."""

    degree: int
    how: str = "fsdp"

    def check(self) -> "Sharding":
        if isinstance(self.degree, bool) or not isinstance(self.degree, int) or not 1 <= self.degree <= MAX_DEGREE:
            raise ProfileError(f"data-parallel shard degree {self.degree!r} is out of range: give the number of "
                               "data-parallel ranks that share the static bytes, a whole number from 1 (no sharding) "
                               f"to {MAX_DEGREE}", subject="dp_shard")
        if self.how not in SHARDINGS:
            raise ProfileError(f"sharding {self.how!r} is not known: use fsdp (ZeRO-3, torchtitan's default), zero1 "
                               "(optimizer state), zero2 (optimizer state and gradients) or fsdp-whole-grads (weights "
                               "and optimizer state; gradients whole until the step's sync)", subject="sharding")
        return self

    def per_param(self, parts: ParamBytes) -> float:
        """Bytes per parameter a rank keeps between passes."""
        n = self.degree
        optimizer = parts.master + parts.state
        if self.how == "zero1":
            return parts.weights + parts.grads + optimizer / n
        if self.how == "zero2":
            return parts.weights + (parts.grads + optimizer) / n
        if self.how == "fsdp-whole-grads":
            return parts.grads + (parts.weights + optimizer) / n
        return parts.total / n

    def gathered_per_param(self, parts: ParamBytes) -> float:
        """Bytes per parameter a layer gathers while it computes (the fsdp kinds; 0 unsharded): its weights,
        and under fsdp its gradient before the reduce-scatter too."""
        if self.degree == 1 or self.how not in ("fsdp", "fsdp-whole-grads"):
            return 0.0
        return float(parts.weights + (parts.grads if self.how == "fsdp" else 0))

    def describe(self) -> str:
        what = {"fsdp": "FSDP / ZeRO-3: parameters, gradients and optimizer state", "zero1": "ZeRO-1: optimizer state",
                "zero2": "ZeRO-2: optimizer state and gradients",
                "fsdp-whole-grads": "FSDP with gradients whole until the step's sync: parameters and optimizer "
                                    "state"}[self.how]
        return f"sharded over {self.degree} data-parallel ranks ({what})"
