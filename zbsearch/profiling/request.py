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
from ..core.sharding import DTYPE_BYTES, OPTIMIZER_STATE_BYTES

DTYPES = tuple(DTYPE_BYTES)
ATTENTIONS = ("naive", "sdpa")
OPTIMIZERS = tuple(OPTIMIZER_STATE_BYTES)
DEFAULT_LINK_GBPS = 200.0  # one 200 Gb/s InfiniBand HDR link per GPU, a common inter-node pipeline link
DEFAULT_MFU = 0.4
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 10

Progress = Callable[[int, int, str], None]  # (done, total, what is running)

E = TypeVar("E", bound=ZbsearchError)


def bad_input(cls: type[E], message: str, *fields: str) -> E:
    """An error of class `cls` about the request fields `fields` (kept on the error as `.fields`)."""
    exc = cls(message)
    exc.fields = fields  # type: ignore[attr-defined]  # an extra attribute, read back with getattr
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

    model = "gpt"

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

    def block_params(self, i: int = 0) -> int:
        h = self.hidden
        return 12 * h * h + 13 * h  # qkv, proj, fc1, fc2 with biases, two LayerNorms

    def layer_params(self) -> list[int]:
        """Parameters of every layer in model order: embedding (token + position), blocks, head."""
        h, V = self.hidden, self.vocab
        return [V * h + self.seq * h, *(self.block_params(i) for i in range(self.layers)), V * h + 2 * h]

    def describe(self) -> dict[str, Any]:
        return {"model": "gpt", **asdict(self), "params": sum(self.layer_params())}

    def label(self) -> str:
        """The start of a profile's default name: gpt-4l-h256-s128-b2."""
        return f"gpt-{self.layers}l-h{self.hidden}-s{self.seq}-b{self.micro_batch}"


def _whole(model: str, key: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        what = "positive" if minimum else "non-negative"
        raise bad_input(ProfilerError, f"{model} {key.replace('_', ' ')} {value!r}: give a {what} whole number", key)


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-style decoder: token embedding, `layers` pre-norm blocks (RMSNorm, grouped-query attention
    with rotary positions, SwiGLU MLP, no biases), final RMSNorm, untied output projection and loss."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: heads
    ffn: int | None = None  # SwiGLU inner size; None: 8h/3 rounded up to a multiple of 256 (Llama's rule)
    seq: int = 128
    micro_batch: int = 1
    vocab: int = 1024
    head_dim: int | None = None  # None: hidden / heads

    model = "llama"

    @property
    def kv(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def dh(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 256 * math.ceil(int(8 * self.hidden / 3) / 256)

    def check(self) -> "LlamaShape":
        for key, value in asdict(self).items():
            if value is not None or key not in ("kv_heads", "ffn", "head_dim", "expert_ffn"):
                _whole(self.model, key, value, 0 if key in ("dense_layers", "shared_experts") else 1)
        if self.heads % self.kv:
            raise bad_input(ProfilerError, f"{self.heads} attention heads are not divisible by {self.kv} key/value "
                            "heads: each key/value head serves a whole group of query heads, e.g. 32 heads with 8",
                            "heads", "kv_heads")
        if self.head_dim is None and self.hidden % self.heads:
            raise bad_input(ProfilerError, f"hidden size {self.hidden} is not divisible by {self.heads} heads: give "
                            "the head size, or a hidden size that heads divide", "hidden", "heads")
        return self

    def attention_params(self) -> int:
        """q, k, v and output projections (no biases)."""
        q, kv = self.heads * self.dh, 2 * self.kv * self.dh
        return self.hidden * (2 * q + kv)

    def mlp_params(self, i: int) -> int:
        return 3 * self.hidden * self.ffn_size  # gate, up and down projections

    def block_params(self, i: int = 0) -> int:
        return self.attention_params() + self.mlp_params(i) + 2 * self.hidden  # two RMSNorm weights

    def layer_params(self) -> list[int]:
        """Parameters of every layer in model order: token embedding, blocks, final norm + output projection."""
        h, V = self.hidden, self.vocab
        return [V * h, *(self.block_params(i) for i in range(self.layers)), V * h + h]

    def describe(self) -> dict[str, Any]:
        resolved = {"kv_heads": self.kv, "ffn": self.ffn_size, "head_dim": self.dh}
        return {"model": self.model, **asdict(self), **resolved, "params": sum(self.layer_params())}

    def label(self) -> str:
        """The start of a profile's default name: llama-32l-h4096-s8192-b1."""
        return f"{self.model}-{self.layers}l-h{self.hidden}-s{self.seq}-b{self.micro_batch}"


@dataclass(frozen=True)
class MoeShape(LlamaShape):
    """A Llama-style decoder whose first `dense_layers` blocks have a dense SwiGLU MLP (size `ffn`) and the
    rest a mixture of experts: a router over `experts` SwiGLU experts of size `expert_ffn`, `top_k` of them
    per token, plus `shared_experts` experts every token passes through. No expert parallelism: every
    expert's parameters sit on the block's stage."""

    dense_layers: int = 1
    experts: int = 8
    top_k: int = 2
    expert_ffn: int | None = None  # None: the dense ffn size (full-size experts)
    shared_experts: int = 0

    model = "moe"

    @property
    def expert_size(self) -> int:
        return self.expert_ffn if self.expert_ffn is not None else self.ffn_size

    def is_moe(self, i: int) -> bool:
        return i >= self.dense_layers

    def check(self) -> "MoeShape":
        super().check()
        if self.dense_layers > self.layers:
            raise bad_input(ProfilerError, f"{self.dense_layers} dense blocks are more than the model's {self.layers} "
                            "blocks: give at most as many dense blocks as blocks", "dense_layers", "layers")
        if self.top_k > self.experts:
            raise bad_input(ProfilerError, f"each token picks {self.top_k} of {self.experts} experts: the top-k must "
                            "not exceed the number of routed experts", "top_k", "experts")
        return self

    def mlp_params(self, i: int) -> int:
        if not self.is_moe(i):
            return super().mlp_params(i)
        h = self.hidden
        return h * self.experts + 3 * h * self.expert_size * (self.experts + self.shared_experts)  # router, experts

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "expert_ffn": self.expert_size}


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


# The torch threads each rank of `zbsearch run` computes with (interop/run/worker.py): measuring a CPU
# profile with as many is what makes its times the run's (issue 29: with torch's default, 2 threads on a
# 2-core machine, a profile predicted 2.36 s per iteration for a run that took 3.98 s; with 1, 4.05 s for
# 4.00 s).
RUN_THREADS = 1


@dataclass(frozen=True)
class MeasureRequest:
    """How to measure the layers on a device (see `measure.measure_layers`)."""

    device: str = "auto"  # auto, cpu, cuda or cuda:N
    dtype: str | None = None  # None: bf16 on a GPU, fp32 on a CPU
    warmup: int = DEFAULT_WARMUP  # untimed runs of every pass
    repeats: int = DEFAULT_REPEATS  # timed runs; the median is kept
    threads: int | None = None  # CPU threads for torch while measuring; None: RUN_THREADS, as a run has
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
