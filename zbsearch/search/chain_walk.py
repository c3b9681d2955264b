"""rank_sequence.py's walk over a chain of several chunks, one layer of states at a time in numpy.

The walk is the same dynamic program: a layer holds every count of each step done after k passes,
each with one state (the earliest corner of all that reach that count: the time the machine is free and
the starts still awaited by a lagged step). Here a layer is a set of arrays and each move is applied
to all of its states at once, which is about twenty times faster than a state at a time in CPython;
the turn rank of a V-shape at 1p (the paper's 14.6B stage, p=16, m=48) needs about two million states.

Two reductions keep the layers narrow; neither loses anything:
- a lag no longer than the step it follows (a chunk's forward right after the previous chunk's on the
  same rank, no hop between) is met by a machine running one pass at a time, so those start times
  are not kept;
- weight passes of the same duration and memory are pooled into one step: which one runs is
  immaterial (nothing waits on a weight pass), only that some backward has one pending.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .rank_sequence import RankChain


@dataclass(frozen=True)
class _Walk:
    """The chain reduced for the walk: steps (pooled weight passes last) and how they wait."""

    duration: np.ndarray
    alloc: np.ndarray
    net: np.ndarray  # alloc - free
    after: tuple[tuple[int, ...], ...]  # steps whose counts bound this one's (a pool: their sum)
    lag: tuple[float | None, ...]  # the lag behind the step it follows, where it can bind
    succ: dict[int, int]  # a step whose starts are kept -> the lagged step that waits on them
    counted: np.ndarray  # the forwards and backwards: the walk to the last backward ends when all ran


def _reduce(chain: "RankChain") -> _Walk:
    steps = chain.steps

    def binds(s) -> bool:
        return s.after is not None and s.lag is not None and s.lag > steps[s.after].duration + 1e-12

    followed = {s.after for s in steps if s.after is not None}
    tails = [k for k, s in enumerate(steps) if s.after is not None and s.lag is None and k not in followed]
    core = [k for k in range(len(steps)) if k not in tails]
    pools: dict[tuple[float, float, float], list[int]] = {}
    for k in tails:
        pools.setdefault((steps[k].duration, steps[k].alloc, steps[k].free), []).append(k)
    index = {k: i for i, k in enumerate(core)}
    after = [() if steps[k].after is None else (index[steps[k].after],) for k in core]
    after += [tuple(index[steps[k].after] for k in ks) for ks in pools.values()]
    lag = [steps[k].lag if binds(steps[k]) else None for k in core] + [None] * len(pools)
    succ = {index[steps[k].after]: index[k] for k in core if binds(steps[k])}
    durations = [steps[k].duration for k in core] + [key[0] for key in pools]
    allocs = [steps[k].alloc for k in core] + [key[1] for key in pools]
    frees = [steps[k].free for k in core] + [key[2] for key in pools]
    counted = [steps[k].after is None or steps[k].lag is not None for k in core] + [False] * len(pools)
    alloc = np.array(allocs)
    return _Walk(np.array(durations), alloc, alloc - np.array(frees), tuple(after), tuple(lag), succ,
                 np.array(counted))


def least_chain_span(chain: "RankChain", max_states: int, to_last_backward: bool = False,
                     deadline: float | None = None) -> float | None:
    """The least span of the chain (or the least time to its last backward), each layer's states of
    one count merged into their earliest corner; None past `max_states` states or the `deadline`
    (time.monotonic()), or when no order fits the limit."""
    w, m = _reduce(chain), chain.m
    cap = chain.cap + 1e-9 * max(1.0, abs(chain.cap))
    n = len(w.after)
    counts = np.zeros((1, n), dtype=np.int64)
    t = np.zeros(1)
    kept = {j: np.empty((1, 0)) for j in w.succ}  # per step with a lagged successor: starts awaited
    radix = (m + 1) ** np.arange(n, dtype=np.int64)
    seen, done = 0, math.inf
    while len(t):
        seen += len(t)
        if seen > max_states or (deadline is not None and time.monotonic() > deadline):
            return None
        moves = [mv for k in range(n) if (mv := _move(w, k, counts, t, kept, cap, m)) is not None]
        if not moves:
            break
        counts, t, kept = _stack(moves, w)
        if to_last_backward:
            over = (counts[:, w.counted] == m).all(axis=1)
            if over.any():
                done = min(done, float(t[over].min()))
                counts, t, kept = counts[~over], t[~over], {j: a[~over] for j, a in kept.items()}
        if len(t):
            counts, t, kept = _merge(counts, t, kept, radix, w)
    if to_last_backward:
        return None if math.isinf(done) else done
    return float(t.min()) if len(t) else None


def _move(w: _Walk, k: int, counts: np.ndarray, t: np.ndarray, kept: dict[int, np.ndarray], cap: float,
          m: int):
    """Every state of the layer with one more pass of step k, where it is ready and fits memory."""
    limit = counts[:, list(w.after[k])].sum(axis=1) if w.after[k] else m
    level = counts @ w.net
    rows = np.nonzero((counts[:, k] < limit) & (level + w.alloc[k] <= cap) & (level + w.net[k] <= cap))[0]
    if not len(rows):
        return None
    begin = t[rows]
    new = {j: a[rows] for j, a in kept.items()}
    if w.lag[k] is not None:
        j = w.after[k][0]
        begin = np.maximum(begin, new[j][:, 0] + w.lag[k])
        new[j] = new[j][:, 1:]
    if k in w.succ:
        waiting = new[k]
        new[k] = np.concatenate([waiting, np.full((len(rows), 1), np.inf)], axis=1)
        new[k][np.arange(len(rows)), counts[rows, k] - counts[rows, w.succ[k]]] = begin
    c = counts[rows]
    c[:, k] += 1
    return c, begin + w.duration[k], new


def _stack(moves, w: _Walk):
    """One array of each kind from the moves (starts awaited padded with inf to one width)."""
    counts = np.concatenate([c for c, _, _ in moves])
    t = np.concatenate([x for _, x, _ in moves])
    kept = {}
    for j in w.succ:
        width = max(new[j].shape[1] for _, _, new in moves)
        kept[j] = np.concatenate([np.pad(new[j], ((0, 0), (0, width - new[j].shape[1])), constant_values=np.inf)
                                  for _, _, new in moves])
    return counts, t, kept


def _merge(counts: np.ndarray, t: np.ndarray, kept: dict[int, np.ndarray], radix: np.ndarray, w: _Walk):
    """One state per count: the earliest corner of those that reach it."""
    key = counts @ radix
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    out = {}
    counts = counts[order][first]
    for j, a in kept.items():
        a = a[order]
        width = int((counts[:, j] - counts[:, w.succ[j]]).max())
        # Reduce along the last axis of the transposed array: numpy's reduceat is far faster that way.
        out[j] = np.minimum.reduceat(a[:, :width].T, first, axis=1).T if width else a[first, :0]
    return counts, np.minimum.reduceat(t[order], first), out
