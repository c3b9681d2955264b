"""The recompute-once wrapper (profiling/recompute_once.py) under torch's split backward: I rebuilds a
recomputed layer's activations, W reuses them (torch.utils.checkpoint would run the forward again in W,
pytorch#166536), and the gradients are those without recompute."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight  # noqa: E402

from zbsearch.core.errors import RunError  # noqa: E402
from zbsearch.profiling.measure import measure_layers  # noqa: E402
from zbsearch.profiling.models import Block  # noqa: E402
from zbsearch.profiling.request import MeasureRequest  # noqa: E402
from zbsearch.profiling.recompute_once import Frames, Switch, wrap  # noqa: E402

pytestmark = pytest.mark.torch


class Counted(torch.nn.Module):
    """Wraps a module and counts its forward calls."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


def split_backward(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One microbatch as torch's pipelining runtime runs a middle stage: F, then I, then W. Returns the
    input gradient and the parameter gradients."""
    x = x.detach().requires_grad_()
    out = model(x)
    grad_out = torch.ones_like(out)
    (dx,), groups = stage_backward_input([out], [grad_out], [x], model.parameters())
    stage_backward_weight(model.parameters(), groups)
    return dx, [p.grad for p in model.parameters()]


def block(seed: int = 0) -> Block:
    torch.manual_seed(seed)
    return Block(32, 4, 16, "naive").double()


def test_full_recompute_runs_the_forward_once_more_and_the_gradients_are_exact() -> None:
    plain = torch.nn.Sequential(torch.nn.Linear(32, 32).double(), Counted(block()))
    frames, switch = Frames(), Switch()
    recomputed = copy.deepcopy(plain)
    counted = recomputed[1]
    recomputed[1] = wrap(counted, "layers.0", "full", switch, frames)
    x = torch.randn(2, 16, 32, dtype=torch.float64)

    want_dx, want = split_backward(plain, x)
    got_dx, got = split_backward(recomputed, x)
    assert counted.calls == 2 and frames.recomputes == 1  # F, then once in I; not again in W
    assert torch.equal(got_dx, want_dx) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert not list(frames.alive)  # W freed the graph, and with it the rebuilt activations


def test_what_a_recomputed_layer_holds_from_f_to_i_and_from_i_to_w() -> None:
    frames = Frames()
    layer = wrap(block(), "layers.0", "full", Switch(), frames)
    x = torch.randn(2, 16, 32, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    held = list(frames.tensors())
    assert len(held) == 1 and held[0].data_ptr() == x.data_ptr()  # only the input, F until I
    (dx,), groups = stage_backward_input([out], [torch.ones_like(out)], [x], layer.parameters())
    rebuilt = {t.untyped_storage().data_ptr() for t in frames.tensors()}
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    assert len(rebuilt - params) > 5  # I rebuilt the block's activations and holds them for W
    stage_backward_weight(layer.parameters(), groups)
    assert frames.recomputes == 1 and not list(frames.alive)


def test_selective_recomputes_only_the_attention_core_once() -> None:
    plain, recomputed = block(), block()
    calls = {"attend": 0}
    attend = recomputed.attend

    def counted(q, k, v):
        calls["attend"] += 1
        return attend(q, k, v)

    recomputed.attend = counted
    frames = Frames()
    wrap(recomputed, "layers.0", "selective", Switch(), frames)
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    want_dx, want = split_backward(plain, x)
    got_dx, got = split_backward(recomputed, x)
    assert calls["attend"] == 2 and frames.recomputes == 1
    assert torch.equal(got_dx, want_dx) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_switch_that_is_off_runs_the_layer_as_it_is() -> None:
    counted, frames, switch = Counted(block()), Frames(), Switch(on=False)
    layer = wrap(counted, "layers.0", "full", switch, frames)
    split_backward(layer, torch.randn(2, 16, 32, dtype=torch.float64))
    assert counted.calls == 1 and frames.recomputes == 0
    switch.on = True
    split_backward(layer, torch.randn(2, 16, 32, dtype=torch.float64))
    assert counted.calls == 3 and frames.recomputes == 1


def test_the_recompute_restores_the_rng_state_of_the_forward() -> None:
    torch.manual_seed(0)
    dropout = torch.nn.Sequential(torch.nn.Linear(8, 8).double(), torch.nn.Dropout(0.5))
    plain, wrapped = copy.deepcopy(dropout), wrap(copy.deepcopy(dropout), "drop", "full", Switch())
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.manual_seed(1)
    want = split_backward(plain, x)
    torch.manual_seed(1)
    got = split_backward(wrapped, x)
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


class Alternating(torch.nn.Module):
    """Saves one tensor on odd calls and two on even ones: its recompute never saves what its forward did."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.tanh() if self.calls % 2 else x.tanh().sin()


def test_a_layer_that_saves_other_tensors_when_recomputed_is_a_one_line_error() -> None:
    layer = wrap(Alternating(), "layers.3", "full", Switch())
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RunError, match=r"^recomputing layers\.3: its forward saved 1 tensors for the backward but its "
                                       r"recompute saved 2, differing from tensor 1 on: .*; run it without recompute$"):
        layer(x).sum().backward()


def test_selective_needs_an_unfused_attention_core() -> None:
    with pytest.raises(RunError, match=r"^layer layers\.1 \(Linear\) has no unfused attention core .*: use full$"):
        wrap(torch.nn.Linear(4, 4), "layers.1", "selective", Switch())
    torch.manual_seed(0)
    with pytest.raises(RunError, match="has no unfused attention core"):
        wrap(Block(32, 4, 16, "sdpa"), "layers.1", "selective", Switch())


def test_the_profiler_lists_no_option_for_a_layer_it_cannot_recompute() -> None:
    torch.manual_seed(0)

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))

    specs = [("0", mlp), ("1", Alternating), ("2", mlp)]
    costs = measure_layers(specs, torch.randn(2, 8), MeasureRequest(device="cpu", warmup=0, repeats=1))
    assert "recompute" not in costs[1].extra
    assert [[o["level"] for o in c.extra["recompute"]] for c in (costs[0], costs[2])] == [["full"], ["full"]]
    assert costs[2].extra["recompute"][0]["mem_B"] == 2 * 8 * 4  # its input only: 2 x 8 fp32
