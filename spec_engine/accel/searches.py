"""The CPU's sampling searches: compiled (csrc/sampling.cpp) where it builds, else numpy on the row in place.

What the core's generic torch code (core/sampling.py, core/verify.py) computes, computed here the same way for
float32 / float64 CPU rows, and reached only through the seam (core/speed.py, `CpuSpeedLayer` in accel/__init__.py).

Why: after a forward has streamed the weights through the caches, every torch call inside a round runs cold
(~15-30 us each), and the generic top-p search, top-k of the display and inverse-CDF pass over whole 49k rows;
the searches below look only among the tokens above a probability floor, or at the members a top-p search found.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import threading
import warnings

import numpy as np
import torch

from spec_engine.accel import native
from spec_engine.core.sampling import SamplingParams

TOP_P_FLOORS = (2.0 ** -6, 2.0 ** -10, 2.0 ** -14)   # candidate floors tried in turn on the CPU
_SEARCHES: list = []                            # [the compiled library or None], settled at first use


def on_cpu_as_numpy(probs: torch.Tensor) -> bool:
    """Whether `probs` can be searched in numpy in place: a float32 / float64 CPU tensor outside autograd."""
    return probs.device.type == "cpu" and probs.dtype in (torch.float32, torch.float64) and not probs.requires_grad


def warp_rows(logits: torch.Tensor, params: SamplingParams):
    """sampling.warp (no greedy) for float32 CPU logits without top-k by one call of the compiled code:
    -> (probs, each row's top-p members most likely first), or None where it does not apply."""
    library = native_searches() if params.top_k == 0 and logits.dtype == torch.float32 and on_cpu_as_numpy(logits) \
        else None
    if library is None:
        return None
    probs, found = native_warp_rows(library, logits.reshape(-1, logits.shape[-1]), params)
    return probs.reshape(logits.shape), found


def top_p_rows(probs: torch.Tensor, top_p: float):
    """sampling.top_p_filter on the CPU -> (kept, each row's members most likely first), or None (not a CPU row).
    Candidates are the tokens above a probability floor (`cpu_top_p_row`, or the same search compiled)."""
    if not on_cpu_as_numpy(probs):
        return None
    rows = probs.reshape(-1, probs.shape[-1])                                 # [R, vocab]
    library = native_searches() if rows.dtype == torch.float32 else None
    if library is not None:
        kept, found = native_top_p_rows(library, rows, top_p)
    else:
        kept = torch.zeros_like(rows)
        found = [cpu_top_p_row(row, top_p, out) for row, out in zip(rows.numpy(), kept.numpy())]
    return kept.reshape(probs.shape), found


def cpu_top_p_row(row: np.ndarray, top_p: float, out: np.ndarray) -> np.ndarray:
    """Write the top-p members of `row` [vocab], renormalised, into `out` [vocab] (zeros, left alone elsewhere);
    returns the members' ids, most likely first (ties by id).

    The definition (csrc/sampling.cpp computes the same numbers for float32 rows): the row sorted most likely first,
    its mass accumulated in the row's dtype in that order, each token kept while the mass before it is below top_p;
    members renormalised by their mass summed in double, in that order (float32's running sum drifts by ~3e-4 over
    the 44k members of a flat row). Candidates: the tokens at or above a floor of
    TOP_P_FLOORS whose sorted mass reaches top_p (no token below it can then be a member), else every token; only
    they are sorted. A floor whose candidates' total falls clearly short is skipped unsorted.
    """
    threshold = row.dtype.type(top_p)
    for floor in (*TOP_P_FLOORS, None):
        if floor is None:
            candidates = np.arange(row.shape[0])
        else:
            candidates = np.flatnonzero(row >= floor)
            if row[candidates].sum(dtype=np.float64) < top_p * 0.999:
                continue
        order = np.argsort(-row[candidates], kind="stable")
        ids, values = candidates[order], row[candidates[order]]                # descending
        through = np.cumsum(values)                                            # sequential, in the row's dtype
        outside = np.flatnonzero(~((through - values) < threshold))            # mass before each candidate
        count = int(outside[0]) if outside.shape[0] else values.shape[0]
        if outside.shape[0] or floor is None or not through[-1] < threshold:
            break                               # else a token below the floor may be a member: widen
    total = row.dtype.type(np.cumsum(values[:count], dtype=np.float64)[-1])   # in order, in double: no drift
    out[ids[:count]] = values[:count] / total
    return ids[:count]

SEARCH_SOURCE = native.CSRC / "sampling.cpp"
SEARCH_FLAGS = ["-fopenmp-simd", *native.isa_flags()]
_SEARCHES_LOCK = threading.Lock()


def native_searches():
    """csrc/sampling.cpp compiled on first use (native.py), or None where it cannot be built or
    SPEC_ENGINE_NATIVE_SEARCH=0 (numpy and torch then do the work). Over float32 rows on the CPU: `top_p_rows` and
    `top_n_rows`, the searches of cpu_top_p_row and top_entries with the very same results, `warp_rows`, warp's
    temperature and softmax (within float rounding of torch's: ~1e-7) followed by the top-p search, and
    `top_probability` (a softmax's largest entry and its index).

    Why compiled: after a forward has streamed the weights through the caches, every numpy and torch call runs
    cold (~15 us for a tensor's item() inside a round, ~2 us in a warm loop). cpu_top_p_row's dozen calls cost
    ~110 us a row inside sampled rounds (~25 us warm) and the display's top entries of a greedy round's dense rows
    ~0.4 ms, together several % of a round on the offline default; one C call does a row in a few us."""
    if not _SEARCHES:
        with _SEARCHES_LOCK:
            if not _SEARCHES:
                library = None
                if os.environ.get("SPEC_ENGINE_NATIVE_SEARCH", "1") != "0":
                    try:
                        library = native.load_library(native.compile_library(
                            SEARCH_SOURCE, "sampling", [*native.BASE_FLAGS, *SEARCH_FLAGS]))
                        pointer, int64 = ctypes.c_void_p, ctypes.c_int64
                        library.top_p_rows.argtypes = [pointer, int64, int64, ctypes.c_float, pointer, pointer, int64,
                                                       pointer]
                        library.top_p_rows.restype = int64
                        library.warp_rows.argtypes = [pointer, int64, int64, ctypes.c_float, ctypes.c_float, pointer,
                                                      pointer, int64, pointer]
                        library.warp_rows.restype = int64
                        library.top_probability.argtypes = [pointer, int64, ctypes.POINTER(ctypes.c_double)]
                        library.top_probability.restype = int64
                        library.top_n_rows.argtypes = [pointer, int64, int64, int64, pointer, pointer]
                        library.top_n_rows.restype = None
                    except native.ERRORS as error:
                        warnings.warn(f"spec_engine: the compiled sampling searches are unavailable "
                                      f"({type(error).__name__}: {error}); using numpy", RuntimeWarning, stacklevel=2)
                        library = None
                _SEARCHES.append(library)
    return _SEARCHES[0]


def native_top_p_rows(library, rows: torch.Tensor, top_p: float) -> tuple[torch.Tensor, list[np.ndarray]]:
    """top_p_filter's CPU search by the compiled library: rows [R, vocab] float32 -> (kept [R, vocab], each row's
    member ids most likely first)."""
    rows = rows.contiguous()
    kept = torch.empty_like(rows)
    members = with_member_buffers(*rows.shape, lambda ids, cap, counts: library.top_p_rows(
        rows.data_ptr(), rows.shape[0], rows.shape[1], top_p, kept.data_ptr(), ids, cap, counts))
    return kept, members


def native_warp_rows(library, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, list[np.ndarray]]:
    """warp's CPU path by the compiled library (temperature, softmax, top-p; no top-k): logits [R, vocab] float32 ->
    (probs [R, vocab], each row's top-p member ids most likely first, or [] without top-p)."""
    logits = logits.contiguous()
    probs = torch.empty_like(logits)
    members = with_member_buffers(*logits.shape, lambda ids, cap, counts: library.warp_rows(
        logits.data_ptr(), logits.shape[0], logits.shape[1], params.temperature, params.top_p, probs.data_ptr(),
        ids, cap, counts))
    return probs, members


def with_member_buffers(count: int, vocab: int, call) -> list[np.ndarray]:
    """Run `call(ids, cap, counts)`, a compiled top-p search writing each of `count` rows' member ids into ids
    [count, cap] and their numbers into counts [count] (-1: no top-p); it returns the room a row needed when cap
    was too small, then it runs again with room for every token. Returns each row's member ids.
    Torch buffers: their data_ptr() is cheaper than numpy's .ctypes, which adds up at ~1 ms a round."""
    cap = min(vocab, NATIVE_MEMBERS)
    while True:
        ids = torch.empty(count, cap, dtype=torch.int32)
        counts = torch.empty(count, dtype=torch.int64)
        if call(ids.data_ptr(), cap, counts.data_ptr()) == 0:
            ids, counts = ids.numpy(), counts.tolist()
            return [ids[r, :counts[r]].astype(np.int64) for r in range(count) if counts[r] >= 0]
        cap = vocab                             # a flat row: room for every token


def native_top_n_rows(library, rows: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """top_entries by the compiled library: rows [R, vocab] float32, n <= vocab -> (values, ids) [R, n]."""
    rows = rows.contiguous()
    values = torch.empty(rows.shape[0], n, dtype=rows.dtype)
    ids = torch.empty(rows.shape[0], n, dtype=torch.int64)
    library.top_n_rows(rows.data_ptr(), rows.shape[0], rows.shape[1], n, ids.data_ptr(), values.data_ptr())
    return values, ids


def argmax_rows(logits: torch.Tensor) -> list[int] | None:
    """Each row's argmax for float32 CPU logits [rows, vocab] without NaN (the first of equal maxima, as torch.argmax),
    by the compiled top-1 search: one vectorised pass a row, where torch's argmax took ~13 us a row over 49k entries
    on the EPYC (a verify's 8 rows ~0.1 ms, in every greedy round). None elsewhere."""
    library = native_searches() if logits.dtype == torch.float32 and logits.dim() == 2 and on_cpu_as_numpy(logits) \
        else None
    if library is None or logits.shape[-1] == 0:
        return None
    return native_top_n_rows(library, logits, 1)[1][:, 0].tolist()


NATIVE_MEMBERS = 1024                           # member ids room per row on the first try

def top_probability(logits: torch.Tensor) -> tuple[float, int] | None:
    """(the largest entry of softmax(logits), its index) for logits [vocab]: a drafter's confidence and its greedy
    pick (the first of equal maxima, as torch.argmax). One call of the compiled code for float32 on the CPU."""
    library = native_searches() if logits.dtype == torch.float32 and logits.dim() == 1 and on_cpu_as_numpy(logits) \
        else None
    if library is not None:
        logits = logits.contiguous()
        prob = ctypes.c_double()
        index = library.top_probability(logits.data_ptr(), logits.shape[0], ctypes.byref(prob))
        return prob.value, index
    return None


def above_a_floor(row: np.ndarray, enough, floors: tuple[float, ...] = TOP_P_FLOORS) -> np.ndarray | None:
    """Ids of the entries of `row` at or above the first of `floors` for which `enough(ids)` holds (None if no floor
    gives enough). Every entry left out is below every entry kept."""
    for floor in floors:
        ids = np.flatnonzero(row >= floor)
        if enough(ids):
            return ids
    return None

def top_entries(probs: torch.Tensor, n: int, members: list | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`torch.topk(probs, n, dim=-1)` for probabilities [..., vocab] -> (values, ids) [..., n], descending.

    Paid for every event (the display's top-3 of every verified position). On the CPU: one call of the compiled
    search (native_searches; a vectorised pass a row), else in numpy among the tokens above the floors of
    TOP_P_FLOORS (see cpu_top_p_row): once n tokens clear a floor, nothing below it can be among the n largest,
    ~10 us a row warm against ~100 us for torch.topk over 49k; there `members`, what warp recorded for these rows
    (each row's nonzero ids, most likely first), makes it a lookup. Ties come lowest id first.
    """
    if not on_cpu_as_numpy(probs):
        return None
    rows = probs.reshape(-1, probs.shape[-1])                                     # [R, vocab]
    library = native_searches() if rows.dtype == torch.float32 else None
    if library is not None:
        values, ids = native_top_n_rows(library, rows, n)
        return values.reshape(*probs.shape[:-1], n), ids.reshape(*probs.shape[:-1], n)
    ids = np.empty((rows.shape[0], n), dtype=np.int64)
    for i, row in enumerate(rows.numpy()):
        candidates = largest_candidates(row, n) if members is None else with_zeros(members[i][:n], row.shape[0], n)
        ids[i] = candidates[np.argsort(-row[candidates], kind="stable")[:n]]
    ids = torch.from_numpy(ids).reshape(*probs.shape[:-1], n)
    return torch.gather(probs, -1, ids), ids

def with_zeros(ids: np.ndarray, vocab: int, n: int) -> np.ndarray:
    """`ids` (the nonzero entries of a row) completed to n ids with the first ids not among them (zeros)."""
    if ids.shape[0] >= n:
        return ids
    taken = set(ids.tolist())
    zeros = itertools.islice((i for i in range(vocab) if i not in taken), n - ids.shape[0])
    return np.concatenate([ids, np.fromiter(zeros, dtype=np.int64)])


SPARSE_SUPPORT = 4096       # a row with at most this many nonzero entries is searched among them directly


def largest_candidates(row: np.ndarray, n: int) -> np.ndarray:
    """At least n ids of `row` [vocab] (probabilities) among which are its n largest, in few passes over the row.

    Most rows have n entries above the first floor (one pass). A warped row (after top-p or top-k) may have fewer:
    its nonzero entries are then searched directly, and when there are fewer than n of them, zeros complete the set
    (a full argpartition of such a row cost ~0.2 ms, and each floor pass ~25 us, a millisecond of every sampled
    round before). Dense rows go on to the lower floors, and to argpartition when even those give too few."""
    candidates = np.flatnonzero(row >= TOP_P_FLOORS[0])
    if candidates.shape[0] >= n:
        return candidates
    support = np.flatnonzero(row)
    if support.shape[0] <= SPARSE_SUPPORT:
        return with_zeros(support, row.shape[0], n)
    candidates = above_a_floor(row, lambda found: found.shape[0] >= n, TOP_P_FLOORS[1:])
    return candidates if candidates is not None else np.argpartition(-row, n - 1)[:n]


def sample_at(probs: torch.Tensor, unit, support: np.ndarray) -> int | None:
    """sampling.sample_at over `support` alone (ids holding every nonzero entry of probs), in id order: the very
    token the whole row gives, without two passes over the vocabulary; None where probs is not a CPU row."""
    if not on_cpu_as_numpy(probs):
        return None
    ids = np.sort(support)
    cdf = np.cumsum(probs.numpy()[ids], dtype=np.float64)
    point = float(unit) * cdf[-1]
    return int(ids[min(int(np.searchsorted(cdf, point, side="right")), ids.shape[0] - 1)])


def residual(target_row: torch.Tensor, draft_row: torch.Tensor, support: np.ndarray) -> torch.Tensor | None:
    """verify.residual_distribution computed over `support` alone: ids holding every nonzero entry of target_row
    [vocab] (the row's top-p members), where the residual's nonzero entries lie too; same fallback to p."""
    if not (on_cpu_as_numpy(target_row) and on_cpu_as_numpy(draft_row) and draft_row.dtype == target_row.dtype):
        return None
    p = target_row.numpy()[support]
    left = np.maximum(p - draft_row.numpy()[support], 0)
    total = left.sum()
    if total <= np.finfo(left.dtype).tiny:
        return target_row
    out = torch.zeros_like(target_row)
    out.numpy()[support] = left / total
    return out


def host_reads(drafted: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor):
    """verify's host reads for CPU rows, in place with numpy: (p(x_i), q(x_i), drafted ids), or None."""
    if not (on_cpu_as_numpy(target_probs) and (draft_probs is None or on_cpu_as_numpy(draft_probs))):
        return None
    ids = drafted.tolist()
    rows = range(len(ids))
    target_p = target_probs.numpy()[rows, ids].tolist()
    draft_q = [1.0] * len(ids) if draft_probs is None else draft_probs.numpy()[rows, ids].tolist()
    return target_p, draft_q, ids
