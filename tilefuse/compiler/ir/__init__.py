"""The loop IR: index arithmetic, scalar expressions over loop variables, and the graph nodes of a lowered graph.

Three layers, all immutable (frozen dataclasses with named fields):

* **Index arithmetic.** An :class:`Index` is ``offset + Σ coef·atom`` where an atom is a loop variable
  (:class:`Var`), a floor-division/modulo of another index (:class:`DivMod`, ``(inner // div) % mod``) or a
  data-dependent index (:class:`Indirect`, e.g. the class id that ``gather`` reads). Views are index
  arithmetic: a permute swaps variables, an expand puts 0, a reshape splits (affine) or merges (div/mod) and
  the simplifier folds ``C·((j // C) % N) + (j % C)`` back into ``j``, so a reshape round trip costs nothing.
* **Expressions.** :class:`Const`, :class:`Load` (an element of another node at a per-dimension index),
  :class:`IndexValue`, :class:`Op`, :class:`Cast`, :class:`Rand`. ``dtype`` is the value's torch dtype as
  eager has it; code generation computes half types in float32.
* **Graph nodes.** :class:`InputNode`, :class:`Pointwise`, :class:`Reduction`, :class:`View`, :class:`Extern`
  in a :class:`Graph`. One node per ATen node (a few ATen ops lower to two, e.g. ``var``).

Index and expression objects are *interned*: building the same structure twice returns the same object, so
identity is structural equality, hashing is O(1), and common subexpressions are shared for free (code
generation emits each object once).
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import torch

# --------------------------------------------------------------------------------------------- interning
_TABLE: "weakref.WeakValueDictionary[tuple, Interned]" = weakref.WeakValueDictionary()


def _key_of(value: Any) -> Any:
    if isinstance(value, Interned):
        return ("@", id(value))  # children are interned: identity is structure
    if isinstance(value, tuple):
        return tuple(_key_of(v) for v in value)
    if isinstance(value, bool):
        return ("b", value)  # True == 1 must not merge a bool constant with an int one
    if isinstance(value, float):
        return ("f", repr(value))  # -0.0 != 0.0, nan == nan
    return value


class Interned:
    """Base of index and expression objects: construct with :meth:`make`, never directly."""

    _fieldnames: tuple[str, ...] = ()

    @classmethod
    def make(cls, *args, **kwargs):
        obj = cls(*args, **kwargs)
        key = (cls,) + tuple(_key_of(getattr(obj, f)) for f in cls._fieldnames)
        found = _TABLE.get(key)
        if found is not None:
            return found
        _TABLE[key] = obj
        return obj


def _interned(cls):
    cls = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
    cls._fieldnames = tuple(f.name for f in dataclasses.fields(cls))
    return cls


def _cached(obj, name, compute):
    value = obj.__dict__.get(name)
    if value is None:
        value = compute()
        object.__setattr__(obj, name, value)
    return value


# ------------------------------------------------------------------------------------------------ atoms
@_interned
class Var(Interned):
    """A loop variable ranging over ``0 .. size-1``."""
    name: str
    size: int

    def sort_key(self):
        return ("0", self.name)

    def bounds(self) -> tuple[int, int]:
        return (0, max(self.size - 1, 0))

    def __repr__(self):
        return self.name


@_interned
class DivMod(Interned):
    """``(inner // div) % mod`` (``mod`` None: no modulo). ``inner`` is non-negative wherever it is used
    unmasked, so floor and truncating division agree (the GPU truncates, the interpreter floors)."""
    inner: "Index"
    div: int
    mod: Optional[int]

    def sort_key(self):
        return _cached(self, "_skey", lambda: ("1", self.inner.sort_key(), self.div, self.mod or 0))

    def bounds(self) -> tuple[int, int]:
        def compute():
            lo, hi = self.inner.bounds()
            qlo, qhi = lo // self.div, hi // self.div
            if self.mod is None:
                return (qlo, qhi)
            if qlo >= 0 and qlo // self.mod == qhi // self.mod:
                return (qlo % self.mod, qhi % self.mod)
            return (0, self.mod - 1)
        return _cached(self, "_bounds", compute)

    def __repr__(self):
        text = f"({self.inner!r})//{self.div}" if self.div != 1 else f"({self.inner!r})"
        return f"{text}%{self.mod}" if self.mod is not None else text


@_interned
class Indirect(Interned):
    """A data-dependent index: the integer value of ``expr`` into a dim of ``size`` elements, in ``0 .. size-1``
    once ``wrap`` (the ATen op counts a negative index from the end, as ``x[idx]`` does) adds ``size`` to a
    negative value. ``op`` names the ATen op the index belongs to: code generation checks the value (``-size
    <= expr < size`` with ``wrap``, else ``0 <= expr < size``) unless its range is proven, and a value outside
    is an error naming ``op`` (eager raises; a read outside the buffer would give garbage). ``op`` empty: the
    index is trusted (built in range by the lowering itself)."""
    expr: "Expr"
    size: int
    wrap: bool = False
    op: str = ""

    def sort_key(self):
        return _cached(self, "_skey", lambda: ("2", expr_key(self.expr), self.size, self.wrap, self.op))

    def bounds(self) -> tuple[int, int]:
        return (0, max(self.size - 1, 0))

    def rebuilt(self, expr: "Expr") -> "Indirect":
        """The same index with another value expression (loop variables substituted, loads replaced)."""
        return self if expr is self.expr else Indirect.make(expr, self.size, self.wrap, self.op)

    def __repr__(self):
        return f"[{format_expr(self.expr)}{' wrapped' if self.wrap else ''}]"


Atom = Union[Var, DivMod, Indirect]


# ------------------------------------------------------------------------------------------------ index
@_interned
class Index(Interned):
    """``offset + Σ coef·atom``, terms sorted by the atoms' structural keys (stable across processes)."""
    terms: tuple  # tuple[tuple[Atom, int], ...], coef != 0
    offset: int

    def sort_key(self):
        return _cached(self, "_skey", lambda: (tuple((a.sort_key(), c) for a, c in self.terms), self.offset))

    def bounds(self) -> tuple[int, int]:
        def compute():
            lo = hi = self.offset
            for atom, coef in self.terms:
                alo, ahi = atom.bounds()
                if coef >= 0:
                    lo += coef * alo
                    hi += coef * ahi
                else:
                    lo += coef * ahi
                    hi += coef * alo
            return (lo, hi)
        return _cached(self, "_bounds", compute)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    def atoms(self) -> tuple[Atom, ...]:
        return tuple(a for a, _ in self.terms)

    def free_vars(self) -> frozenset[str]:
        def compute():
            names: set[str] = set()
            for atom, _ in self.terms:
                if isinstance(atom, Var):
                    names.add(atom.name)
                elif isinstance(atom, DivMod):
                    names |= atom.inner.free_vars()
                else:
                    names |= expr_vars(atom.expr)
            return frozenset(names)
        return _cached(self, "_vars", compute)

    def __repr__(self):
        parts = []
        for atom, coef in self.terms:
            parts.append(repr(atom) if coef == 1 else f"{coef}*{atom!r}")
        if self.offset or not parts:
            parts.append(str(self.offset))
        return " + ".join(parts)


def const_index(value: int) -> Index:
    return Index.make((), int(value))


def var_index(name: str, size: int) -> Index:
    return Index.make(((Var.make(name, int(size)), 1),), 0)


def _triple(atom: Atom):
    """The atom as ``(inner, div, mod)`` (a variable is ``(v, 1, None)``); None for data-dependent atoms."""
    if isinstance(atom, DivMod):
        return atom.inner, atom.div, atom.mod
    if isinstance(atom, Var):
        return Index.make(((atom, 1),), 0), 1, None
    return None


def make_index(terms: Iterable[tuple[Atom, int]], offset: int = 0) -> Index:
    """Sum the terms (same atoms added up), merge digit pairs ``c·(X//d % m) + c·m·(X//(d·m) % m2)`` into
    ``c·(X//d % (m·m2))``, drop zero coefficients, sort."""
    acc: dict[Atom, int] = {}
    for atom, coef in terms:
        if coef:
            acc[atom] = acc.get(atom, 0) + coef
    changed = len(acc) > 1
    while changed:
        changed = False
        triples = {atom: _triple(atom) for atom in acc}  # kept alive: the keys below use their ids
        by_digit: dict[tuple[int, int], Atom] = {}
        for atom, coef in acc.items():
            t = triples[atom]
            if t is not None and coef:
                by_digit[(id(t[0]), t[1])] = atom
        for atom, coef in list(acc.items()):
            if not coef:
                continue
            t = triples[atom]
            if t is None or t[2] is None:
                continue
            inner, div, mod = t
            other = by_digit.get((id(inner), div * mod))
            if other is None or other is atom or acc.get(other, 0) != coef * mod:
                continue
            other_mod = triples[other][2]
            merged = divmod_index(inner, div, None if other_mod is None else mod * other_mod)
            del acc[atom]
            del acc[other]
            for a2, c2 in merged.terms:
                acc[a2] = acc.get(a2, 0) + c2 * coef
            offset += merged.offset * coef
            changed = True
            break
    items = [(a, c) for a, c in acc.items() if c]
    items.sort(key=lambda ac: ac[0].sort_key())
    return Index.make(tuple(items), int(offset))


def add(*indices: Index) -> Index:
    terms: list = []
    offset = 0
    for ix in indices:
        terms.extend(ix.terms)
        offset += ix.offset
    return make_index(terms, offset)


def scale(ix: Index, k: int) -> Index:
    if k == 1:
        return ix
    return make_index([(a, c * k) for a, c in ix.terms], ix.offset * k)


def add_const(ix: Index, k: int) -> Index:
    return ix if k == 0 else Index.make(ix.terms, ix.offset + int(k))


def divmod_index(inner: Index, div: int, mod: Optional[int]) -> Index:
    """``(inner // div) % mod`` simplified: exact when ``inner`` is non-negative (checked by its bounds)."""
    if div <= 0 or (mod is not None and mod <= 0):
        raise ValueError(f"divmod_index: div={div}, mod={mod} must be positive")
    lo, hi = inner.bounds()
    if inner.is_constant:
        q = inner.offset // div
        return const_index(q % mod if mod is not None else q)
    if lo >= 0:
        if hi < div:
            return const_index(0)
        if mod is not None and hi // div < mod:
            mod = None
        if div > 1:
            # inner = div*H + R with R >= 0  =>  inner // div == H + R // div (a reshape's merged index
            # 448*i0 + 64*i1 + i2 over 16 -> 28*i0 + 4*i1 + i2//16; the modulo that follows drops the first two)
            high = [(a, c // div) for a, c in inner.terms if c % div == 0]
            if high and len(high) < len(inner.terms):
                q_off, r_off = divmod(inner.offset, div)
                rest = make_index([(a, c) for a, c in inner.terms if c % div != 0], r_off)
                if rest.bounds()[0] >= 0:
                    return mod_index(add(make_index(high, q_off), divmod_index(rest, div, None)), mod)
            # inner = g*H + R with 0 <= R < g and g | div  =>  inner // div == H // (div/g)
            gs = sorted({math.gcd(div, abs(c)) for _, c in inner.terms} - {1}, reverse=True)
            for g in gs:
                high = [(a, c // g) for a, c in inner.terms if c % g == 0]
                low = [(a, c) for a, c in inner.terms if c % g != 0]
                q_off, r_off = divmod(inner.offset, g)
                rest = make_index(low, r_off)
                rlo, rhi = rest.bounds()
                if rlo >= 0 and rhi < g and all(c > 0 for _, c in high):
                    h = make_index(high, q_off)
                    return mod_index(h, mod) if g == div else divmod_index(h, div // g, mod)
        else:
            return mod_index(inner, mod)
        # (X // d2 % m2) // d  with m2 a multiple of d: one DivMod
        if len(inner.terms) == 1 and inner.offset == 0 and inner.terms[0][1] == 1 and \
                isinstance(inner.terms[0][0], DivMod):
            a = inner.terms[0][0]
            if a.mod is None:
                return divmod_index(a.inner, a.div * div, mod)
            if a.mod % div == 0:
                m2 = a.mod // div
                if mod is None or mod % m2 == 0:
                    return divmod_index(a.inner, a.div * div, m2)
                if m2 % mod == 0:
                    return divmod_index(a.inner, a.div * div, mod)
    if div == 1 and mod is None:
        return inner
    return Index.make(((DivMod.make(inner, div, mod), 1),), 0)


def mod_index(ix: Index, mod: Optional[int]) -> Index:
    if mod is None:
        return ix
    lo, hi = ix.bounds()
    if lo >= 0 and hi < mod:
        return ix
    if lo >= 0:
        kept = [(a, c) for a, c in ix.terms if c % mod != 0]
        reduced = make_index(kept, ix.offset % mod)
        rlo, rhi = reduced.bounds()
        if rlo >= 0 and rhi < mod:
            return reduced
        if rlo >= 0:
            ix = reduced
        # ix = g*H + R with 0 <= R < g and g | mod  =>  ix % mod == g*(H % (mod/g)) + R (a reshape's split
        # index (8*i1 + i2) % 32 over i2 < 8 -> 8*(i1 % 4) + i2, which then merges with 32*(i1 // 4): without
        # it the view of a (7, 2, 32) block as (7, 8, 8) heads was "not strided", and MHA's graphs ran in ATen)
        for g in sorted({math.gcd(mod, abs(c)) for _, c in ix.terms} - {1}, reverse=True):
            high = [(a, c // g) for a, c in ix.terms if c % g == 0]
            q_off, r_off = divmod(ix.offset, g)
            rest = make_index([(a, c) for a, c in ix.terms if c % g != 0], r_off)
            h = make_index(high, q_off)
            rlo, rhi = rest.bounds()
            if high and rlo >= 0 and rhi < g and h.bounds()[0] >= 0:
                return add(scale(mod_index(h, mod // g), g), rest)
        if len(ix.terms) == 1 and ix.offset == 0 and ix.terms[0][1] == 1:
            a = ix.terms[0][0]
            if isinstance(a, Var):
                return Index.make(((DivMod.make(ix, 1, mod), 1),), 0)
            if isinstance(a, DivMod) and (a.mod is None or a.mod % mod == 0):
                return divmod_index(a.inner, a.div, mod)
    return Index.make(((DivMod.make(ix, 1, mod), 1),), 0)


def substitute(ix: Index, mapping: Mapping[str, Index]) -> Index:
    """Replace loop variables by indices (variables not in ``mapping`` stay)."""
    if not mapping or not (ix.free_vars() & mapping.keys()):
        return ix
    terms: list = []
    offset = ix.offset
    for atom, coef in ix.terms:
        if isinstance(atom, Var):
            rep = mapping.get(atom.name)
            part = rep if rep is not None else Index.make(((atom, 1),), 0)
        elif isinstance(atom, DivMod):
            part = divmod_index(substitute(atom.inner, mapping), atom.div, atom.mod)
        else:
            part = Index.make(((atom.rebuilt(substitute_expr(atom.expr, mapping)), 1),), 0)
        terms.extend((a, c * coef) for a, c in part.terms)
        offset += part.offset * coef
    return make_index(terms, offset)


def unravel(linear: Index, shape: Sequence[int]) -> tuple[Index, ...]:
    """Per-dimension indices of a row-major linear index into ``shape``."""
    out = []
    stride = 1
    for size in reversed(shape):
        # a zero-size dim: nothing is ever computed there (the runtime launches nothing), any index will do
        out.append(divmod_index(linear, stride, size) if size > 1 else const_index(0))
        stride *= max(size, 1)
    return tuple(reversed(out))


def linearize(indices: Sequence[Index], shape: Sequence[int]) -> Index:
    terms: list = []
    offset = 0
    stride = 1
    for ix, size in zip(reversed(indices), reversed(shape)):
        terms.extend((a, c * stride) for a, c in ix.terms)
        offset += ix.offset * stride
        stride *= size
    return make_index(terms, offset)


def strided_offset(indices: Sequence[Index], stride: Sequence[int], offset: int = 0) -> Index:
    """The element offset of ``indices`` in a buffer with these strides."""
    terms: list = []
    for ix, st in zip(indices, stride):
        if st:
            terms.extend((a, c * st) for a, c in ix.terms)
            offset += ix.offset * st
    return make_index(terms, offset)


# ------------------------------------------------------------------------------------------ expressions
class Expr(Interned):
    dtype: torch.dtype


@_interned
class Const(Expr):
    """A scalar constant. ``from_size``: it came from a (possibly dynamic) size, so code generation passes it
    as a kernel argument rather than writing it into the source."""
    value: Union[int, float, bool]
    dtype: torch.dtype
    from_size: bool = False


@_interned
class Load(Expr):
    """Element ``index`` (one Index per dimension of ``buffer``) of the node named ``buffer``; ``mask``: only
    where this boolean expression holds (elsewhere the load reads nothing and gives 0)."""
    buffer: str
    index: tuple  # tuple[Index, ...]
    dtype: torch.dtype
    mask: Optional["Expr"] = None


@_interned
class IndexValue(Expr):
    """The integer value of an index expression (arange, iota comparisons, argmax positions)."""
    index: Index
    dtype: torch.dtype


@_interned
class Op(Expr):
    """A pointwise primitive (see lowering.PRIMITIVES for the names); all ``args`` have the dtypes the
    primitive expects (the lowering inserts casts), ``dtype`` is the result's."""
    name: str
    args: tuple  # tuple[Expr, ...]
    dtype: torch.dtype


@_interned
class Cast(Expr):
    """A dtype conversion with torch's semantics (float->int truncates; to a half type rounds)."""
    arg: Expr
    dtype: torch.dtype


@_interned
class Rand(Expr):
    """Philox random numbers: uniform in [0, 1) (``normal`` False) or standard normal, from the graph's
    ``seed``-th seed at counter ``offset`` (the element's linear position)."""
    seed: int
    offset: Index
    normal: bool
    dtype: torch.dtype = torch.float32


@_interned
class Local(Expr):
    """Inside one kernel: the value of the kernel's root ``name`` at the current position (no memory traffic;
    the scheduler makes these from loads of a root by another root of the same kernel)."""
    name: str
    dtype: torch.dtype


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Cast):
        return (e.arg,)
    if isinstance(e, Load):
        kids = tuple(a.expr for ix in e.index for a in _indirect_atoms(ix))
        return kids + ((e.mask,) if e.mask is not None else ())
    if isinstance(e, IndexValue):
        return tuple(a.expr for a in _indirect_atoms(e.index))
    return ()


def _indirect_atoms(ix: Index) -> list[Indirect]:
    out = []
    for atom, _ in ix.terms:
        if isinstance(atom, Indirect):
            out.append(atom)
        elif isinstance(atom, DivMod):
            out.extend(_indirect_atoms(atom.inner))
    return out


def walk(root: Expr) -> list[Expr]:
    """Every distinct sub-expression of ``root``, operands before users."""
    seen: set[int] = set()
    order: list[Expr] = []
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        e, expanded = stack.pop()
        if expanded:
            order.append(e)
            continue
        if id(e) in seen:
            continue
        seen.add(id(e))
        stack.append((e, True))
        for c in reversed(children(e)):
            if id(c) not in seen:
                stack.append((c, False))
    return order


def loads(root: Expr) -> list[Load]:
    return [e for e in walk(root) if isinstance(e, Load)]


def expr_vars(e: Expr) -> frozenset[str]:
    def compute():
        names: set[str] = set()
        if isinstance(e, Load):
            for ix in e.index:
                names |= ix.free_vars()
        elif isinstance(e, IndexValue):
            names |= e.index.free_vars()
        elif isinstance(e, Rand):
            names |= e.offset.free_vars()
        for c in children(e):
            names |= expr_vars(c)
        return frozenset(names)
    return _cached(e, "_vars", compute)


def expr_key(e: Expr):
    """A structural key for ordering (stable across processes)."""
    def compute():
        if isinstance(e, Const):
            return ("c", repr(e.value), str(e.dtype))
        if isinstance(e, Load):
            return ("l", e.buffer, tuple(ix.sort_key() for ix in e.index),
                    expr_key(e.mask) if e.mask is not None else None)
        if isinstance(e, IndexValue):
            return ("i", e.index.sort_key(), str(e.dtype))
        if isinstance(e, Op):
            return ("o", e.name, tuple(expr_key(a) for a in e.args), str(e.dtype))
        if isinstance(e, Cast):
            return ("t", expr_key(e.arg), str(e.dtype))
        if isinstance(e, Rand):
            return ("r", e.seed, e.offset.sort_key(), e.normal)
        if isinstance(e, Local):
            return ("v", e.name)
        raise TypeError(type(e))
    return _cached(e, "_key", compute)


def substitute_expr(e: Expr, mapping: Mapping[str, Index], memo: dict | None = None) -> Expr:
    """Replace loop variables inside every index of ``e``."""
    if not mapping or not (expr_vars(e) & mapping.keys()):
        return e
    memo = {} if memo is None else memo
    found = memo.get(id(e))
    if found is not None:
        return found
    if isinstance(e, Load):
        out = Load.make(e.buffer, tuple(substitute(ix, mapping) for ix in e.index), e.dtype,
                        None if e.mask is None else substitute_expr(e.mask, mapping, memo))
    elif isinstance(e, IndexValue):
        out = IndexValue.make(substitute(e.index, mapping), e.dtype)
    elif isinstance(e, Rand):
        out = Rand.make(e.seed, substitute(e.offset, mapping), e.normal, e.dtype)
    elif isinstance(e, Op):
        out = Op.make(e.name, tuple(substitute_expr(a, mapping, memo) for a in e.args), e.dtype)
    elif isinstance(e, Cast):
        out = Cast.make(substitute_expr(e.arg, mapping, memo), e.dtype)
    else:
        out = e
    memo[id(e)] = out
    return out


def replace_loads(e: Expr, fn, memo: dict | None = None) -> Expr:
    """Rebuild ``e`` with every Load replaced by ``fn(load)`` (an Expr; return the load to keep it)."""
    memo = {} if memo is None else memo
    found = memo.get(id(e))
    if found is not None:
        return found
    if isinstance(e, Load):
        mask = None if e.mask is None else replace_loads(e.mask, fn, memo)
        index = tuple(_replace_index_loads(ix, fn, memo) for ix in e.index)
        base = e if (mask is e.mask and all(a is b for a, b in zip(index, e.index))) else \
            Load.make(e.buffer, index, e.dtype, mask)
        out = fn(base)
    elif isinstance(e, Op):
        args = tuple(replace_loads(a, fn, memo) for a in e.args)
        out = e if all(a is b for a, b in zip(args, e.args)) else Op.make(e.name, args, e.dtype)
    elif isinstance(e, Cast):
        arg = replace_loads(e.arg, fn, memo)
        out = e if arg is e.arg else Cast.make(arg, e.dtype)
    elif isinstance(e, IndexValue):
        ix = _replace_index_loads(e.index, fn, memo)
        out = e if ix is e.index else IndexValue.make(ix, e.dtype)
    else:
        out = e
    memo[id(e)] = out
    return out


def _replace_index_loads(ix: Index, fn, memo) -> Index:
    if not _indirect_atoms(ix):
        return ix
    terms = []
    offset = ix.offset
    for atom, coef in ix.terms:
        if isinstance(atom, Indirect):
            terms.append((atom.rebuilt(replace_loads(atom.expr, fn, memo)), coef))
        elif isinstance(atom, DivMod):
            part = divmod_index(_replace_index_loads(atom.inner, fn, memo), atom.div, atom.mod)
            terms.extend((a, c * coef) for a, c in part.terms)
            offset += part.offset * coef
        else:
            terms.append((atom, coef))
    return make_index(terms, offset)


def format_expr(e: Expr, depth: int = 0) -> str:
    if depth > 12:
        return "..."
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Load):
        idx = ", ".join(repr(ix) for ix in e.index)
        mask = f" if {format_expr(e.mask, depth + 1)}" if e.mask is not None else ""
        return f"{e.buffer}[{idx}{mask}]"
    if isinstance(e, IndexValue):
        return f"index({e.index!r})"
    if isinstance(e, Op):
        return f"{e.name}({', '.join(format_expr(a, depth + 1) for a in e.args)})"
    if isinstance(e, Cast):
        return f"to_{str(e.dtype).replace('torch.', '')}({format_expr(e.arg, depth + 1)})"
    if isinstance(e, Rand):
        return f"{'randn' if e.normal else 'rand'}(seed{e.seed}, {e.offset!r})"
    if isinstance(e, Local):
        return f"${e.name}"
    return repr(e)


# ------------------------------------------------------------------------------------------ graph nodes
@dataclasses.dataclass(frozen=True)
class InputNode:
    """A tensor argument of the graph (position ``position`` in the call)."""
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    position: int

    @property
    def origins(self) -> tuple[str, ...]:
        return ()


@dataclasses.dataclass(frozen=True)
class Pointwise:
    """``self[i0..] = body`` over ``shape`` (variables ``i0, i1, ...``). ``into``: write the result into this
    input instead of a new buffer (``copy_`` into a graph input, i.e. an input mutation)."""
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    body: Expr
    origins: tuple[str, ...]
    into: Optional[str] = None


REDUCTION_KINDS = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


@dataclasses.dataclass(frozen=True)
class Reduction:
    """``kind``-reduce ``body`` (over ``space``, variables ``i0, i1, ...``) along the ``reduced`` dimensions.
    The result has ``shape``; ``out_dims[k]`` is the dimension of ``space`` that output dimension ``k`` runs
    over, or None for a kept size-1 dimension. argmax/argmin give the row-major position within the reduced
    dimensions."""
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    kind: str
    space: tuple[int, ...]
    reduced: tuple[int, ...]
    out_dims: tuple[Optional[int], ...]
    body: Expr
    origins: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class View:
    """An alias of ``source``: element ``v`` of this node is element ``index(v)`` of the source. Loads of a view
    are composed into loads of its source during lowering; the node stays for outputs and extern arguments
    (where the runtime makes a real strided view with the ``stride``/``storage_offset`` eager has)."""
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    source: str
    index: tuple  # tuple[Index, ...] over the view's own variables
    origins: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    storage_offset: int = 0


@dataclasses.dataclass(frozen=True)
class Extern:
    """An ATen call. ``args``/``kwargs`` hold ``Ref`` for tensor arguments; ``outputs`` the result's tensors
    (a single tensor, or a tuple: names ``{name}.0`` ...). ``reason``: why it was not lowered (None when an
    extern is the design, e.g. a matmul: the seam where a template with a fused epilogue will go)."""
    name: str
    op: Any
    args: tuple
    kwargs: tuple  # tuple[(key, value)]
    outputs: tuple  # tuple[Optional[TensorMeta], ...]
    tuple_output: bool
    origins: tuple[str, ...]
    reason: Optional[str] = None
    # why an op that tilefuse can compile in general (a matmul) runs in ATen here, by design rather than as a
    # fallback (an operand the library GEMM does not take: a dtype, an empty dim): shown by explain
    note: Optional[str] = None

    def output_name(self, k: int) -> str:
        return f"{self.name}.{k}" if self.tuple_output else self.name


@dataclasses.dataclass(frozen=True)
class Gemm:
    """``self = a @ b`` through the library's GEMM (:mod:`tilefuse.kernels.gemm.plan`): 2-D (M, K) @ (K, N), or a
    batch (Z, M, K) @ (Z, K, N). ``a`` and ``b`` name the operand nodes (a View is read through its strides:
    the backward's ``grad @ W`` and ``x.T @ grad`` are not copied). The output has ``shape``/``stride``/``dtype``
    (the operands' float dtype); the scheduler may fuse pointwise consumers into the GEMM's epilogue
    (:class:`tilefuse.compiler.scheduler.GemmStep`)."""
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    a: str
    b: str
    origins: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Ref:
    """A tensor argument of an extern call: the node named ``name``."""
    name: str


@dataclasses.dataclass(frozen=True)
class Output:
    """One value the graph returns: a node's tensor (``name``), or a Python value (``value``)."""
    name: Optional[str]
    value: Any = None


Node = Union[InputNode, Pointwise, Reduction, View, Extern, Gemm]


@dataclasses.dataclass(frozen=True)
class Graph:
    nodes: tuple  # tuple[Node, ...], in execution order
    outputs: tuple[Output, ...]
    num_args: int
    device: torch.device
    seeds: int  # how many Philox seeds one call draws

    def by_name(self) -> dict[str, Node]:
        table = {}
        for n in self.nodes:
            table[n.name] = n
            if isinstance(n, Extern):
                for k in range(len(n.outputs)):
                    table[n.output_name(k)] = n
        return table


def node_meta(node: Node, name: str | None = None) -> TensorMeta:
    """The shape/stride/dtype of a node's tensor (for an extern, of output ``name``)."""
    if isinstance(node, Extern):
        k = 0 if name is None or name == node.name else int(name.rsplit(".", 1)[1])
        meta = node.outputs[k]
        if meta is None:
            raise ValueError(f"{node.name}: output {k} is not a tensor")
        return meta
    offset = node.storage_offset if isinstance(node, View) else 0
    return TensorMeta(tuple(node.shape), tuple(node.stride), node.dtype, offset)


def loop_vars(shape: Sequence[int], prefix: str = "i") -> tuple[Index, ...]:
    return tuple(var_index(f"{prefix}{d}", s) for d, s in enumerate(shape))


def format_node(node: Node) -> str:
    dt = str(node.dtype).replace("torch.", "") if hasattr(node, "dtype") else ""
    if isinstance(node, InputNode):
        return f"{node.name} = input#{node.position} {dt}{list(node.shape)} stride {list(node.stride)}"
    if isinstance(node, Pointwise):
        into = f" (into {node.into})" if node.into else ""
        return f"{node.name} = pointwise {dt}{list(node.shape)}{into}: {format_expr(node.body)}"
    if isinstance(node, Reduction):
        return (f"{node.name} = {node.kind} over dims {list(node.reduced)} of {list(node.space)} -> "
                f"{dt}{list(node.shape)}: {format_expr(node.body)}")
    if isinstance(node, View):
        return f"{node.name} = view {dt}{list(node.shape)} of {node.source}[{', '.join(map(repr, node.index))}]"
    if isinstance(node, Extern):
        why = f"  (fallback: {node.reason})" if node.reason else f"  ({node.note})" if node.note else ""
        return f"{node.name} = extern {node.op}{why}"
    if isinstance(node, Gemm):
        return f"{node.name} = gemm {dt}{list(node.shape)}: {node.a} @ {node.b}"
    return repr(node)


def format_graph(graph: Graph) -> str:
    lines = [format_node(n) for n in graph.nodes]
    lines.append("return " + ", ".join(o.name if o.name else repr(o.value) for o in graph.outputs))
    return "\n".join(lines)
