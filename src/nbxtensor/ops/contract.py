"""Contractions: einsum and tensordot, written over matmul (so they run on every device
that multiplies matrices).

einsum parses the equation (explicit `->`, implicit output, `...`), takes repeated indices of
one operand as a diagonal view, sums out indices that no other operand and not the output
needs, then contracts operands pairwise: the next pair is the one with the cheapest product
(smallest result, then fewest multiply-adds), not the leftmost. Each pairwise contraction is
one batched matmul over (shared kept indices) x (left-only) x (contracted) x (right-only).
"""
from __future__ import annotations

import builtins
import math

from ..tensor import Tensor
from . import linalg as _la
from . import reduction as _red
from ._common import check_tensor
from .structure import diagonal

__all__ = ["einsum", "tensordot"]

_LETTERS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _parse(equation: str, operands):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: the equation has {len(terms)} operand(s) but "
                         f"{len(operands)} tensor(s) were given")
    ell_dims = 0
    subs = []
    for k, (term, t) in enumerate(zip(terms, operands)):
        if term.count("...") > 1 or "." in term.replace("...", ""):
            raise ValueError(f"einsum: operand {k} subscript {term!r}: '...' may appear once, "
                             f"and '.' only as part of it")
        letters = term.replace("...", "")
        bad = [c for c in letters if c not in _LETTERS]
        if bad:
            raise ValueError(f"einsum: subscripts must be letters [a-zA-Z], got {bad[0]!r} in "
                             f"operand {k}")
        if "..." in term:
            ne = t.ndim - len(letters)
            if ne < 0:
                raise ValueError(f"einsum: operand {k} has {t.ndim} dims, fewer than the "
                                 f"{len(letters)} subscripts of {term!r}")
            ell_dims = builtins.max(ell_dims, ne)
            head, _, tail = term.partition("...")
            # ellipsis dims get private names (digits), right-aligned across operands
            subs.append(list(head) + [str(j) for j in range(ne - 1, -1, -1)] + list(tail))
        else:
            if len(term) != t.ndim:
                raise ValueError(f"einsum: operand {k} has {t.ndim} dims but subscript "
                                 f"{term!r} names {len(term)}")
            subs.append(list(term))
    ell = [f"{j}" for j in range(ell_dims - 1, -1, -1)]
    if arrow:
        if rhs.count("...") > 1 or "." in rhs.replace("...", ""):
            raise ValueError(f"einsum: output subscript {rhs!r}: '...' may appear once")
        head, dots, tail = rhs.partition("...")
        out = list(head) + (ell if dots else []) + list(tail)
        seen_in = {c for s in subs for c in s}
        for c in head + tail:
            if c not in _LETTERS:
                raise ValueError(f"einsum: output subscripts must be letters, got {c!r}")
            if c not in seen_in:
                raise ValueError(f"einsum: output subscript {c!r} does not appear in any operand")
        if len(set(out)) != len(out):
            raise ValueError(f"einsum: output subscript {rhs!r} repeats an index")
    else:
        counts: dict = {}
        for s in subs:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        out = ell + sorted(c for c, n in counts.items() if n == 1 and not c.isdigit())
    return subs, out


def einsum(equation, *operands):
    """torch.einsum(equation, *operands) (operands also as one list)."""
    if not isinstance(equation, str):
        raise TypeError(f"einsum: equation must be a str, got {type(equation).__name__}")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError("einsum: expected at least one operand")
    for i, t in enumerate(operands):
        check_tensor(t, f"operands[{i}]", "einsum")
        if t.device != operands[0].device:
            raise ValueError(f"einsum: operands[{i}] is on {t.device} but operands[0] is on "
                             f"{operands[0].device}")
        if t.dtype is not operands[0].dtype:
            raise TypeError(f"einsum: operands must share one dtype, got {operands[0].dtype.name} "
                            f"and {t.dtype.name} (operands[{i}])")
    subs, out = _parse(equation, operands)
    # sizes: an index's size is its size in every operand, or 1 there (broadcast)
    size: dict = {}
    for k, (s, t) in enumerate(zip(subs, operands)):
        for c, n in zip(s, t.shape):
            m = size.get(c, 1)
            if n != 1 and m != 1 and n != m:
                raise ValueError(f"einsum: index {c!r} has size {m} in one operand and {n} in "
                                 f"operands[{k}]")
            size[c] = builtins.max(m, n) if c in size else n
    ops = []
    for s, t in zip(subs, operands):
        t, s = _take_diagonals(t, list(s))
        ops.append((t, s))
    # contract pairwise, cheapest product first
    while len(ops) > 1:
        best = None
        for i in range(len(ops)):
            for j in range(i + 1, len(ops)):
                keep = _needed(ops, (i, j), out)
                res = [c for c in _union(ops[i][1], ops[j][1]) if c in keep]
                cost = (math.prod(size[c] for c in res),
                        math.prod(size[c] for c in _union(ops[i][1], ops[j][1])))
                if best is None or cost < best[0]:
                    best = (cost, i, j, keep)
        _, i, j, keep = best
        merged = _contract(ops[i], ops[j], keep, size)
        ops = [o for k, o in enumerate(ops) if k not in (i, j)] + [merged]
    t, s = ops[0]
    t, s = _sum_out(t, s, set(out))
    if len(s) != len(out):   # an output index that was only broadcast (size 1 everywhere)
        for c in out:
            if c not in s:
                t, s = t.unsqueeze(t.ndim), s + [c]
    t = t.permute([s.index(c) for c in out]) if s else t
    shape = [size[c] for c in out]
    if tuple(t.shape) != tuple(shape):
        t = t.expand(shape)
    return t   # a view where no product was needed ('ij->ji', 'ii->i'), as torch


def _union(a, b):
    return list(a) + [c for c in b if c not in a]


def _needed(ops, pair, out) -> set:
    keep = set(out)
    for k, (_, s) in enumerate(ops):
        if k not in pair:
            keep.update(s)
    return keep


def _take_diagonals(t, s):
    """A repeated index within one operand is its diagonal (a view)."""
    while True:
        rep = next((c for c in s if s.count(c) > 1), None)
        if rep is None:
            return t, s
        i = s.index(rep)
        j = s.index(rep, i + 1)
        t = diagonal(t, 0, i, j)
        s = [c for k, c in enumerate(s) if k not in (i, j)] + [rep]


def _sum_out(t, s, keep):
    drop = [k for k, c in enumerate(s) if c not in keep]
    if drop:
        t = _red.sum(t, tuple(drop))
        s = [c for c in s if c in keep]
    return t, s


def _contract(a, b, keep, size):
    (ta, sa), (tb, sb) = a, b
    # indices only one side has and nobody needs later are summed before the product
    ta, sa = _sum_out(ta, sa, keep | set(sb))
    tb, sb = _sum_out(tb, sb, keep | set(sa))
    batch = [c for c in sa if c in sb and c in keep]
    contr = [c for c in sa if c in sb and c not in keep]
    fa = [c for c in sa if c not in sb]
    fb = [c for c in sb if c not in sa]

    def arrange(t, s, order):
        t = t.permute([s.index(c) for c in order]) if order else t
        full = [size[c] for c in order]
        return t.expand(full) if tuple(t.shape) != tuple(full) else t

    pa = arrange(ta, sa, batch + fa + contr)
    pb = arrange(tb, sb, batch + contr + fb)
    nb = math.prod(size[c] for c in batch)
    m = math.prod(size[c] for c in fa)
    kk = math.prod(size[c] for c in contr)
    n = math.prod(size[c] for c in fb)
    r = _la.matmul(pa.reshape(nb, m, kk), pb.reshape(nb, kk, n))
    return r.reshape([size[c] for c in batch + fa + fb]), batch + fa + fb


def tensordot(a, b, dims=2, out=None):
    """Sum of products over the last `dims` dims of a and the first of b (an int), or over the
    listed dims (a pair of lists); one matmul."""
    check_tensor(a, "a", "tensordot"), check_tensor(b, "b", "tensordot")
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int) and not isinstance(dims, builtins.bool):
        if dims < 0:
            raise ValueError(f"tensordot: dims must be non-negative, got {dims}")
        if dims > a.ndim or dims > b.ndim:
            raise ValueError(f"tensordot: dims ({dims}) exceeds the dims of a ({a.ndim}) or b "
                             f"({b.ndim})")
        da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    elif isinstance(dims, (list, tuple)) and len(dims) == 2:
        da = [dims[0]] if isinstance(dims[0], int) else list(dims[0])
        db = [dims[1]] if isinstance(dims[1], int) else list(dims[1])
        if len(da) != len(db):
            raise ValueError(f"tensordot: both dim lists must have one length, got {da} and {db}")
        da = [d % a.ndim if -a.ndim <= d < a.ndim else _bad_dim(d, a.ndim) for d in da]
        db = [d % b.ndim if -b.ndim <= d < b.ndim else _bad_dim(d, b.ndim) for d in db]
    else:
        raise TypeError(f"tensordot: dims must be an int or a pair of dim lists, got {dims!r}")
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise ValueError(f"tensordot: contracted dims have sizes {a.shape[i]} (a dim {i}) "
                             f"and {b.shape[j]} (b dim {j})")
    fa = [d for d in range(a.ndim) if d not in da]
    fb = [d for d in range(b.ndim) if d not in db]
    k = math.prod(a.shape[d] for d in da)
    pa = a.permute(fa + da).reshape(math.prod(a.shape[d] for d in fa), k)
    pb = b.permute(db + fb).reshape(k, math.prod(b.shape[d] for d in fb))
    r = _la.matmul(pa, pb).reshape([a.shape[d] for d in fa] + [b.shape[d] for d in fb])
    if out is not None:
        from ._common import check_out
        check_out(out, r.shape, r.dtype, r.device, "tensordot").copy_(r)
        return out
    return r


def _bad_dim(d, nd):
    raise IndexError(f"tensordot: dim {d} is out of range for a {nd}-D tensor")

