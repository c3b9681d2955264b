"""The small float64 test models `zbsearch run --model mlp|gpt-tiny` runs (one chunk per stage, the same
weights in every process for one seed), their batch and loss; and torch, imported only when asked for."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Callable

from ...core.errors import DependencyError, RunError
from ..formats.torch_import import INSTALL_HINT

if TYPE_CHECKING:
    import torch
    from torch import Tensor

MODELS = ("mlp", "gpt-tiny")
MLP_WIDTH = 16
GPT = {"vocab": 64, "width": 32, "heads": 2, "seq": 8}


def require_torch() -> ModuleType:
    """torch with its pipelining package, or a DependencyError saying how to install it."""
    try:
        import torch
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        raise DependencyError(f"zbsearch run needs torch, which is not installed: {INSTALL_HINT}") from None
    return torch


def build_chunks(model: str, num_chunks: int, seed: int) -> list[torch.nn.Module]:
    """The model cut into `num_chunks` float64 modules, identical in every process for one seed."""
    torch = require_torch()
    nn = torch.nn
    torch.manual_seed(seed)
    if model == "mlp":
        chunks = [nn.Sequential(nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.Tanh()) for _ in range(num_chunks)]
    elif model == "gpt-tiny":
        chunks = [_gpt_chunk(torch, first=c == 0, last=c == num_chunks - 1) for c in range(num_chunks)]
    else:
        raise RunError(f"model {model!r} is not known: use one of {', '.join(MODELS)}", subject="model")
    return [c.double() for c in chunks]


def _gpt_chunk(torch: ModuleType, first: bool, last: bool) -> torch.nn.Module:
    """One transformer block, with the embeddings in front on the first chunk and the head behind on
    the last."""
    from torch import nn
    from torch.nn import functional as F
    V, D, H, T = GPT["vocab"], GPT["width"], GPT["heads"], GPT["seq"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

        def forward(self, x: Tensor) -> Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
            q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
            return x + self.mlp(self.ln2(x))

    class Chunk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if first:
                self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
            self.block = Block()
            if last:
                self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, V)

        def forward(self, x: Tensor) -> Tensor:
            if first:
                x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            x = self.block(x)
            return self.head(self.ln_f(x)) if last else x

    return Chunk()


def make_batch(model: str, num_microbatches: int, microbatch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for one iteration, identical in every process."""
    torch = require_torch()
    g = torch.Generator().manual_seed(seed + 1)
    n = num_microbatches * microbatch_size
    if model == "mlp":
        return (torch.randn(n, MLP_WIDTH, generator=g, dtype=torch.float64),
                torch.randn(n, MLP_WIDTH, generator=g, dtype=torch.float64))
    V, T = GPT["vocab"], GPT["seq"]
    return torch.randint(0, V, (n, T), generator=g), torch.randint(0, V, (n, T), generator=g)


def loss_function(model: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    torch = require_torch()
    F = torch.nn.functional
    if model == "mlp":
        return F.mse_loss
    return lambda logits, target: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
