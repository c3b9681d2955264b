"""What a run trains: the model's shape, the sequence length, the global batch in sequences, the dtype, the
optimizer and the MFU its matrix work runs at."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

from ...core.errors import PlanError, about
from ...profiling.estimate import check_mfu
from ...profiling.request import DTYPES, OPTIMIZERS, LlamaShape, MoeShape, check_choice
from .measured import load_measured

Model = Union[LlamaShape, MoeShape]

# The MFU estimates run at unless given, calibrated (bench/calibrate_mfu.py, results/calibrate_mfu.md) against
# torchtitan's Llama 3.1 8B with FSDP on 8 H100, local batch 2 x 8,192, selective (op) recompute, eager: 5,762
# tokens/s/GPU, 33-39% MFU (torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, December 2024, Table 1).
# In this cost model (t1 p1 dp8 fsdp-reshard b2, op-level selective recompute charged as the recomputed matrix
# multiplies) the input 0.374 reproduces it, where our own accounting reports MFU 33.7%; 0.37 to two places.
DEFAULT_RUN_MFU = 0.37


@dataclass(frozen=True)
class Workload:
    """`model` (its `micro_batch` is replaced by each shape's b), `global_batch` sequences of `model.seq` tokens
    per step; `preset`: the preset the model came from, for the citation."""

    model: Model
    global_batch: int
    dtype: str = "bf16"
    optimizer: str = "adam"
    mfu: float = DEFAULT_RUN_MFU
    attention: str = "sdpa"
    preset: str | None = None
    measured: tuple[str, ...] = ()  # measured profiles (paths) whose layers replace the estimate's (measured.py)

    @property
    def seq(self) -> int:
        return self.model.seq

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.model.seq

    def at_micro_batch(self, b: int) -> Model:
        """The model with `b` sequences per microbatch."""
        return replace(self.model, micro_batch=b)

    def check(self) -> "Workload":
        with about("model"):
            self.model.check()
        if isinstance(self.global_batch, bool) or not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise PlanError(f"global batch {self.global_batch!r} is not a count of sequences: give a whole number "
                            ">= 1, e.g. 512", subject="global_batch")
        with about("mfu"):
            check_mfu(self.mfu)
        check_choice(self.dtype, DTYPES, "dtype", "dtype")
        check_choice(self.optimizer, OPTIMIZERS, "optimizer", "optimizer")
        for path in self.measured:
            load_measured(path)  # a bad file is refused before any shape runs
        return self
