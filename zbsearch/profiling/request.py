"""What a profiling run may be asked for: the built-in GPT's shape, the stage split, the pipeline setup
and the measurement settings, as small typed records. Needs no torch.

Errors raised for a bad request carry `fields`, the names of the request fields at fault (`hidden`,
`gpu`, `stages`, ...), so that a front end can point at its own spelling of them (the CLI's flags)
while the message itself speaks in domain terms.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence, TypeVar

from ..core.errors import ProfilerError, ZbsearchError
from ..core.profile import check_microbatches

DTYPES = ("bf16", "fp16", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ATTENTIONS = ("naive", "sdpa")
OPTIMIZERS = ("adam", "sgd", "none")
DEFAULT_LINK_GBPS = 200.0  # one 200 Gb/s InfiniBand HDR link per GPU, a common inter-node pipeline link
DEFAULT_MFU = 0.4
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 10

Progress = Callable[[int, int, str], None]  # (done, total, what is running)

E = TypeVar("E", bound=ZbsearchError)


def bad_input(cls: type[E], message: str, *fields: str) -> E:
    """An error of class `cls` about the request fields `fields` (kept on the error as `.fields`)."""
    exc = cls(message)
    exc.fields = fields  # type: ignore[attr-defined]
    return exc


def check_choice(value: str, choices: Sequence[str], what: str, field: str) -> str:
    """`value` when it is one of `choices`, else a ProfilerError naming `what` and the choices."""
    if value not in choices:
        raise bad_input(ProfilerError, f"{what} {value!r} is not supported: use one of {', '.join(choices)}", field)
    return value


def check_factory_spec(spec: str) -> tuple[str, str]:
    """(module, attribute) of a model factory written `package.module:factory`.

    >>> check_factory_spec("my_models:build")
    ('my_models', 'build')
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or ":" in attr or not module_name.strip() or not attr.strip():
        raise bad_input(ProfilerError, f"model {spec!r}: write gpt or package.module:factory, e.g. my_models:build",
                        "model")
    return module_name.strip(), attr.strip()


@dataclass(frozen=True)
class GptShape:
    """The built-in GPT-style decoder: embedding, `layers` pre-LN blocks, final norm + LM head + loss."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    seq: int = 128
    micro_batch: int = 2
    vocab: int = 1024

    def check(self) -> "GptShape":
        for key, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                what = key.replace("_", " ")
                raise bad_input(ProfilerError, f"GPT {what} {value!r}: give a positive whole number", key)
        if self.hidden % self.heads:
            raise bad_input(ProfilerError, f"hidden size {self.hidden} is not divisible by {self.heads} heads: "
                            "each head gets hidden / heads channels, e.g. hidden 256 with 4 heads",
                            "hidden", "heads")
        return self

    def block_params(self) -> int:
        h = self.hidden
        return 12 * h * h + 13 * h  # qkv, proj, fc1, fc2 with biases, two LayerNorms

    def describe(self) -> dict[str, Any]:
        return {"model": "gpt", **asdict(self)}

    def label(self) -> str:
        """The start of a profile's default name: gpt-4l-h256-s128-b2."""
        return f"gpt-{self.layers}l-h{self.hidden}-s{self.seq}-b{self.micro_batch}"


@dataclass(frozen=True)
class StageSplit:
    """How the layers become pipeline stages.

    Either `stages` for the exact linear-partition DP, or `layers_per_stage` to force the split
    (counting the movable layers only). `anchored` = (a, z): the first a layers always sit on the
    first stage and the last z on the last one; the model decides it (the GPT's embedding and head).
    """

    stages: int | None = None
    layers_per_stage: tuple[int, ...] | None = None
    anchored: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class PipelineSetup:
    """What the profile records beyond the layers' costs."""

    microbatches: int | None = None  # None: 2p
    link_gbps: float | None = None  # None: measured between two GPUs when there are two, else the default
    optimizer: str = "adam"  # whose state counts in the static bytes
    torch_stage0: bool = False  # cost stage 0 as torch's runtime runs it: no I, W is the whole backward

    def check(self) -> "PipelineSetup":
        if self.microbatches is not None:
            check_microbatches(self.microbatches)
        gbps = self.link_gbps
        if gbps is not None and not (isinstance(gbps, (int, float)) and math.isfinite(gbps) and gbps > 0):
            raise bad_input(ProfilerError, f"link bandwidth {gbps} Gb/s is not positive: give a positive number of "
                            "gigabits per second, e.g. 200", "link_gbps")
        check_choice(self.optimizer, OPTIMIZERS, "optimizer", "optimizer")
        return self


@dataclass(frozen=True)
class MeasureRequest:
    """How to measure the layers on a device (see `measure.measure_layers`)."""

    device: str = "auto"  # auto, cpu, cuda or cuda:N
    dtype: str | None = None  # None: bf16 on a GPU, fp32 on a CPU
    warmup: int = DEFAULT_WARMUP  # untimed runs of every pass
    repeats: int = DEFAULT_REPEATS  # timed runs; the median is kept
    threads: int | None = None  # CPU threads for torch while measuring; None: torch's
    interleave: bool = True  # round-robin over resident layers; False: one layer at a time

    def check(self) -> "MeasureRequest":
        if not (isinstance(self.warmup, int) and self.warmup >= 0):
            raise bad_input(ProfilerError, f"warm-up runs {self.warmup!r}: give a whole number >= 0", "warmup")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise bad_input(ProfilerError, f"timed repeats {self.repeats!r}: give a whole number >= 1", "repeats")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise bad_input(ProfilerError, f"CPU threads {self.threads!r}: give a positive number of threads, e.g. 1",
                            "threads")
        if self.dtype is not None:
            check_choice(self.dtype, DTYPES, "dtype", "dtype")
        return self
