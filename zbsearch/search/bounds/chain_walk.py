"""bounds/rank_sequence.py's walk over a chain of several chunks, one layer of states at a time in numpy.

The walk is the same dynamic program: a layer holds every count of each step done after k passes,
each with one state (the earliest corner of all that reach that count: the time the machine is free and
the starts still awaited by a lagged step). Here a layer is a set of arrays and each move is applied
to all of its states at once, about twenty times faster than a state at a time in CPython.

Three reductions keep the layers narrow:
- a lag no longer than the step it follows (a chunk's forward right after the previous chunk's on the
  same rank, no hop between) is met by a machine running one pass at a time, so those start times
  are not kept (exact);
- weight passes of the same duration and memory are pooled into one step: which one runs is
  immaterial (nothing waits on a weight pass), only that some backward has one pending (exact);
- twins, a step and one of the same cost right after it on the same rank (the V-shape's turn rank
  holds two chunks back to back: two equal forwards, two equal backwards), are pooled too, a relaxation
  explained at _twins. On the turn rank of the paper's V-shape at 1p it gave the walk's exact answer
  wherever that finished (14.6B stage: p=8, m=24; p=16, m=48 and 128; 28.3B: p=32, m=96) with 30 to 90
  times fewer states: p=32, m=96 took 127 s before and 1.4 s after.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .rank_chain import RankChain


@dataclass(frozen=True)
class _Walk:
    """The chain reduced for the walk: its steps (twins merged, pooled weight passes last) and how
    they wait. A step of multiplicity 2 is a pair of twins: m * 2 passes, the k-th of which stands for
    the first twin when k is even and the second when k is odd."""

    duration: np.ndarray
    alloc: np.ndarray
    net: np.ndarray  # alloc - free
    mult: np.ndarray
    after: tuple[tuple[int, ...], ...]  # steps whose counts bound this one's (a pool: their sum)
    lag: tuple[float | None, ...]  # the lag behind the step it follows, where it can bind
    succ: dict[int, int]  # a step whose starts are kept -> the lagged step that waits on them
    counted: np.ndarray  # the forwards and backwards: the walk to the last backward ends when all ran
    size: np.ndarray  # passes per microbatch (a pool or a twin pair: two)


def _cost(step) -> tuple[float, float, float]:
    return step.duration, step.alloc, step.free


def _reduce(chain: RankChain) -> _Walk:
    steps = chain.steps

    def binds(s) -> bool:
        return s.after is not None and s.lag is not None and s.lag > steps[s.after].duration + 1e-12

    followed = {s.after for s in steps if s.after is not None}
    tails = [k for k, s in enumerate(steps) if s.after is not None and s.lag is None and k not in followed]
    pools: dict[tuple[float, float, float], list[int]] = {}
    for k in tails:
        pools.setdefault(_cost(steps[k]), []).append(k)
    pool_of = {k: cost for cost, ks in pools.items() for k in ks}
    groups = _twins(steps, [k for k in range(len(steps)) if k not in tails], pool_of, binds)
    group = {k: g for g, members in enumerate(groups) for k in members}
    lead = [steps[members[0]] for members in groups]
    after: list[tuple[int, ...]] = [() if s.after is None else (group[s.after],) for s in lead]
    # (a pool's steps are tails, each after some step)
    after += [tuple(sorted({group[a] for k in ks if (a := steps[k].after) is not None})) for ks in pools.values()]
    # A lagged step waits on the last member of the group before it (a twin pair's second).
    succ = {group[s.after]: group[k] for k, s in enumerate(steps) if k in group and binds(s) and s.after is not None}
    lag = [s.lag if binds(s) else None for s in lead] + [None] * len(pools)
    alloc = np.array([s.alloc for s in lead] + [c[1] for c in pools])
    free = np.array([s.free for s in lead] + [c[2] for c in pools])
    return _Walk(np.array([s.duration for s in lead] + [c[0] for c in pools]), alloc, alloc - free,
                 np.array([len(members) for members in groups] + [1] * len(pools)), tuple(after), tuple(lag), succ,
                 np.array([s.after is None or s.lag is not None for s in lead] + [False] * len(pools)),
                 np.array([len(members) for members in groups] + [len(ks) for ks in pools.values()]))


def _twins(steps, core: list[int], pool_of: dict[int, tuple], binds) -> list[list[int]]:
    """The core steps, each alone or with its twin: a step of the same cost right after it on the same
    rank (the V-shape's turn: the two chunks' forwards, their backwards), where only a lagged step
    waiting on the second twin and weight passes of one pool wait on either. Pooling them is a
    relaxation: the k-th pass of the pair starts no later than a relabelled schedule's, and the b-th
    backward of a pair of twin backwards starts no sooner than the (b // 2)-th backward that waits on
    the forwards (every prefix of the backwards has at least as many of those), so it waits on forward
    pair b // 2. Both twins cost the same, so memory is unchanged."""
    groups = {k: [k] for k in core}
    for k in core:
        j = steps[k].after
        if j is None or binds(steps[k]) or j not in groups or len(groups[j]) > 1 or len(groups[k]) > 1:
            continue
        if _cost(steps[j]) != _cost(steps[k]):
            continue
        others = [d for d, s in enumerate(steps) if s.after in (j, k) and d != k]
        lagged = [d for d in others if binds(steps[d])]
        rest = [d for d in others if d not in lagged]
        if any(steps[d].after == j for d in lagged) or len(lagged) > 1:
            continue
        if any(d not in pool_of for d in rest) or len({pool_of[d] for d in rest}) > 1:
            continue
        groups[j].append(k)
        del groups[k]
    return list(groups.values())


def least_chain_span(chain: RankChain, max_states: int, to_last_backward: bool = False,
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
        level = counts @ w.net
        moves = [mv for k in range(n) if (mv := _move(w, k, counts, level, t, kept, cap, m)) is not None]
        if not moves:  # every pass has run, or memory holds every next one back
            full = (counts == m * w.size).all(axis=1)
            counts, t = counts[full], t[full]
            break
        counts, t, kept = _stack(moves, w)
        if to_last_backward:
            over = (counts[:, w.counted] == m * w.size[w.counted]).all(axis=1)
            if over.any():
                done = min(done, float(t[over].min()))
                counts, t, kept = counts[~over], t[~over], {j: a[~over] for j, a in kept.items()}
        if len(t):
            counts, t, kept = _merge(counts, t, kept, radix, w)
    if to_last_backward:
        return None if math.isinf(done) else done
    return float(t.min()) if len(t) else None


def _move(w: _Walk, k: int, counts: np.ndarray, level: np.ndarray, t: np.ndarray, kept: dict[int, np.ndarray],
          cap: float, m: int):
    """Every state of the layer (memory held: `level`) with one more pass of step k, where it is ready
    and fits memory."""
    mult = w.mult[k]
    if w.lag[k] is not None:  # only the passes whose awaited start is kept
        j = w.after[k][0]
        limit = mult * (counts[:, j] // w.mult[j])
    else:
        limit = counts[:, list(w.after[k])].sum(axis=1) if w.after[k] else w.size[k] * m
    rows = np.nonzero((counts[:, k] < limit) & (level + w.alloc[k] <= cap) & (level + w.net[k] <= cap))[0]
    if not len(rows):
        return None
    begin = t[rows]
    done = counts[rows, k]
    new = {j: a[rows] for j, a in kept.items()}
    if w.lag[k] is not None:
        j = w.after[k][0]
        begin = np.maximum(begin, new[j][:, 0] + w.lag[k])
        last = done % mult == mult - 1  # the pass that uses the start up (a pair's second)
        new[j] = np.where(last[:, None], _widen(new[j][:, 1:], new[j].shape[1]), new[j])
    if k in w.succ:
        s = w.succ[k]
        waiting = _widen(new[k], new[k].shape[1] + 1)
        keep = np.flatnonzero(done % mult == mult - 1)
        waiting[keep, done[keep] // mult - counts[rows[keep], s] // w.mult[s]] = begin[keep]
        new[k] = waiting
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
        kept[j] = np.concatenate([_widen(new[j], width) for _, _, new in moves])
    return counts, t, kept


def _widen(a: np.ndarray, width: int) -> np.ndarray:
    """`a` with columns of inf (no start awaited) added on the right up to `width` (np.pad's general
    path cost more than the rest of the walk on small layers)."""
    if a.shape[1] >= width:
        return a
    out = np.full((a.shape[0], width), np.inf)
    out[:, :a.shape[1]] = a
    return out


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
        width = int((counts[:, j] // w.mult[j] - counts[:, w.succ[j]] // w.mult[w.succ[j]]).max())
        # Reduce along the last axis of the transposed array: numpy's reduceat is far faster that way.
        out[j] = np.minimum.reduceat(a[:, :width].T, first, axis=1).T if width else a[first, :0]
    return counts, np.minimum.reduceat(t[order], first), out
