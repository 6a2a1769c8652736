"""``pypto.SymbolicScalar``: an integer known only when the kernel runs (a loop index, a value read
from an integer tensor such as a paged-attention block table, or arithmetic on them).

A SymbolicScalar is an expression tree. While a kernel is traced it also carries a *hint*, the
value it has in the iteration being traced (None for values read from tensor data): the tracer
uses the hint where it needs a Python value (a view's size, ``if idx < 3:``, ``int(idx)``) and
records the use as a *guard* of the traced loop body (`pypto_lab.pto.loops`), so that the body
is traced again for the iterations where the guard would come out differently. Offsets, loop
bounds and ``pypto.cond`` conditions stay symbolic and are evaluated with the actual loop indices
and tensor data when the kernel runs (`evaluate`).
"""

from __future__ import annotations

import operator

import numpy as np

from .errors import PtoError, ScalarReadError


class SymbolicValueError(PtoError):
    """A SymbolicScalar used where a Python value is needed but none is known (``concrete()`` of a
    symbol, ``if`` on a value read from tensor data)."""


_BIN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
        "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
        "!=": operator.ne}
_CMP = ("<", "<=", ">", ">=", "==", "!=")


def _vmin(a, b):
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def _vmax(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _vand(a, b):
    return np.logical_and(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else (a and b)


def _vor(a, b):
    return np.logical_or(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else (a or b)


GUARD_HOOK = None   # set by pypto_lab.pto.loops: records a hint used as a Python value as a guard
KERNEL_GUARD_HOOK = None   # set by pypto_lab.pto.loops: the same for a value read from data outside a symbolic loop

_FN = dict(_BIN, min=_vmin, max=_vmax, **{"and": _vand, "or": _vor})


class SymbolicScalar:
    """``pypto.SymbolicScalar()`` / ``(10)`` / ``("x")`` / ``("x", 10)`` / ``(other)``.

    Kinds: ``imm`` (a constant), ``sym`` (a named symbol), ``idx`` (a loop index), ``read`` (an
    element of an integer tensor), or an operation on others (``+ - * // %``, comparisons,
    ``min``/``max``, ``and``/``or``/``not``)."""

    __slots__ = ("kind", "args", "name", "hint", "_fn")

    def __init__(self, arg0=None, arg1=None):
        if isinstance(arg0, SymbolicScalar):
            self.kind, self.args, self.name, self.hint = arg0.kind, arg0.args, arg0.name, arg0.hint
        elif isinstance(arg0, str):
            self.kind, self.args, self.name = "sym", (), arg0
            self.hint = None if arg1 is None else int(arg1)
        else:
            v = 0 if arg0 is None else int(arg0)
            self.kind, self.args, self.name, self.hint = "imm", (v,), "", v

    @classmethod
    def _make(cls, kind, args, name="", hint=None) -> SymbolicScalar:
        s = cls.__new__(cls)
        s.kind, s.args, s.name, s.hint = kind, tuple(args), name, hint
        return s

    @classmethod
    def index(cls, loop_id: int, name: str, hint) -> SymbolicScalar:
        return cls._make("idx", (loop_id,), name, hint)

    @classmethod
    def read(cls, tensor_id: int, indices, name: str) -> SymbolicScalar:
        return cls._make("read", (tensor_id, tuple(indices)), name, None)

    # ---- the real API's queries ----
    def is_concrete(self) -> bool:
        return self.kind == "imm"

    def concrete(self) -> int:
        if self.kind != "imm":
            raise SymbolicValueError(f"{self}.concrete(): not a concrete value. Rule: only a constant "
                                     "SymbolicScalar has a value before the kernel runs (is_concrete() says so). "
                                     "Fix: check is_concrete() first, or keep computing with the symbol")
        return self.args[0]

    def is_symbol(self) -> bool:
        return self.kind in ("sym", "idx", "read")

    def is_expression(self) -> bool:
        return self.kind not in ("imm", "sym", "idx", "read")

    def is_immediate(self) -> bool:
        return self.kind == "imm"

    def as_variable(self) -> None:
        """Recorded only: pypto_lab evaluates every expression when the kernel runs."""

    def min(self, other) -> SymbolicScalar:
        return _op("min", self, other)

    def max(self, other) -> SymbolicScalar:
        return _op("max", self, other)

    # ---- arithmetic ----
    def __add__(self, o): return _op("+", self, o)
    def __radd__(self, o): return _op("+", o, self)
    def __sub__(self, o): return _op("-", self, o)
    def __rsub__(self, o): return _op("-", o, self)
    def __mul__(self, o): return _op("*", self, o)
    def __rmul__(self, o): return _op("*", o, self)
    def __floordiv__(self, o): return _op("//", self, o)
    def __rfloordiv__(self, o): return _op("//", o, self)
    def __truediv__(self, o): return _op("//", self, o)   # integer division, as the real SymbolicScalar
    def __rtruediv__(self, o): return _op("//", o, self)
    def __mod__(self, o): return _op("%", self, o)
    def __rmod__(self, o): return _op("%", o, self)
    def __neg__(self): return _op("-", 0, self)
    def __pos__(self): return self
    def __lt__(self, o): return _op("<", self, o)
    def __le__(self, o): return _op("<=", self, o)
    def __gt__(self, o): return _op(">", self, o)
    def __ge__(self, o): return _op(">=", self, o)
    def __eq__(self, o): return _op("==", self, o)   # noqa: D105 (symbolic, as the real API)
    def __ne__(self, o): return _op("!=", self, o)
    def __and__(self, o): return _op("and", self, o)
    def __rand__(self, o): return _op("and", o, self)
    def __or__(self, o): return _op("or", self, o)
    def __ror__(self, o): return _op("or", o, self)
    def __invert__(self): return _op("==", self, 0)
    __hash__ = object.__hash__

    # ---- Python values: the hint, recorded as a guard of the loop body being traced ----
    def __bool__(self) -> bool:
        return bool(_need_value(self, "the truth value (if / while / and / or / bool())", truth=True))

    def __int__(self) -> int:
        return int(_need_value(self, "int()"))

    def __index__(self) -> int:
        return int(_need_value(self, "operator.index() (an index, a range() bound or a size)"))

    # ---- structure ----
    def depends_on_data(self) -> bool:
        if self.kind == "read":
            return True
        return any(isinstance(a, SymbolicScalar) and a.depends_on_data() for a in self.args)

    def loop_ids(self) -> set:
        if self.kind == "idx":
            return {self.args[0]}
        out = set()
        for a in self.args:
            if isinstance(a, SymbolicScalar):
                out |= a.loop_ids()
            elif isinstance(a, tuple):
                for x in a:
                    if isinstance(x, SymbolicScalar):
                        out |= x.loop_ids()
        return out

    def evaluate(self, idx: dict, read=None):
        """The value with loop indices ``idx`` ({loop id: int or numpy array}) and ``read(tensor id,
        (i, j, ...), expr)`` giving tensor elements."""
        try:
            fn = self._fn
        except AttributeError:
            fn = self._fn = self._compile()
        return fn(idx, read)

    def _compile(self):
        """A closure computing the value (the tree walked once, not at every iteration)."""
        k = self.kind
        if k == "imm":
            v = self.args[0]
            return lambda idx, read: v
        if k == "idx":
            lid = self.args[0]
            return lambda idx, read: idx[lid]
        if k in ("sym", "read", "not"):
            return self._walk
        fa, fb = (a.evaluate if isinstance(a, SymbolicScalar) else (lambda idx, read, a=a: a) for a in self.args)
        f = _FN[k]
        return lambda idx, read: f(fa(idx, read), fb(idx, read))

    def _walk(self, idx: dict, read=None):
        k = self.kind
        if k == "imm":
            return self.args[0]
        if k == "idx":
            return idx[self.args[0]]
        if k == "sym":
            if self.hint is None:
                raise SymbolicValueError(f"symbol {self.name!r} has no value when the kernel runs. Rule: pypto_lab "
                                         "binds loop indices and tensor reads at run time, not free symbols. Fix: "
                                         f"give it one (pypto.SymbolicScalar({self.name!r}, value)) or use a loop "
                                         "index")
            return self.hint
        if k == "read":
            tid, ix = self.args
            return read(tid, tuple(evaluate(i, idx, read) for i in ix), self)
        if k == "not":
            v = evaluate(self.args[0], idx, read)
            return np.logical_not(v) if isinstance(v, np.ndarray) else (not v)
        a, b = (evaluate(x, idx, read) for x in self.args)
        return _FN[k](a, b)

    def __str__(self) -> str:
        k = self.kind
        if k == "imm":
            return str(self.args[0])
        if k in ("sym", "idx", "read"):
            return self.name
        if k in ("min", "max"):
            return f"RUNTIME_{k.capitalize()}({self.args[0]}, {self.args[1]})"
        if k == "not":
            return f"(!{self.args[0]})"
        sym = {"and": "&&", "or": "||"}.get(k, k)
        return f"({self.args[0]}{sym}{self.args[1]})"

    def __repr__(self) -> str:
        return f"SymbolicScalar({self})"


symbolic_scalar = SymbolicScalar


class ConcreteScalar(int):
    """A value the real framework holds as a SymbolicScalar but that is known while tracing here: a
    tensor's dimension (``x.shape[0]``; each concrete size compiles its own kernel) or the index of
    an unrolled loop. It is an ``int`` with the SymbolicScalar methods kernels call on sizes
    (``(bs - i * t).min(t)``, ``.max``, ``is_concrete()``, ...); arithmetic with ints stays a
    ConcreteScalar, with a SymbolicScalar it becomes one."""

    def min(self, other):
        return _op("min", self, other) if isinstance(other, SymbolicScalar) else ConcreteScalar(min(int(self), int(other)))

    def max(self, other):
        return _op("max", self, other) if isinstance(other, SymbolicScalar) else ConcreteScalar(max(int(self), int(other)))

    def is_concrete(self) -> bool:
        return True

    def concrete(self) -> int:
        return int(self)

    def is_symbol(self) -> bool:
        return False

    def is_expression(self) -> bool:
        return False

    def is_immediate(self) -> bool:
        return True


def _keep(name):
    base = getattr(int, name)

    def method(self, *other):
        r = base(self, *other)
        return ConcreteScalar(r) if type(r) is int else r
    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
              "__rfloordiv__", "__mod__", "__rmod__", "__neg__", "__abs__"):
    setattr(ConcreteScalar, _name, _keep(_name))


def evaluate(x, idx: dict, read=None):
    """An int (or numpy array) from an int or a SymbolicScalar."""
    return x.evaluate(idx, read) if isinstance(x, SymbolicScalar) else x


def is_symbolic(x) -> bool:
    return isinstance(x, SymbolicScalar) and x.kind != "imm"


def hint_of(x):
    """The trace-time value of an int or SymbolicScalar (None if it depends on tensor data)."""
    if isinstance(x, SymbolicScalar):
        return x.hint
    return x


def _as_sym(x) -> SymbolicScalar:
    if isinstance(x, SymbolicScalar):
        return x
    if isinstance(x, (bool, np.bool_)):
        return SymbolicScalar(int(x))
    if isinstance(x, (int, np.integer)):
        return SymbolicScalar(int(x))
    if hasattr(x, "__index__") and not hasattr(x, "_trace"):  # SymbolicDim, LoopIndex
        return SymbolicScalar(int(x))
    raise TypeError(f"a SymbolicScalar combines with ints and SymbolicScalars, not {type(x).__name__} {x!r}")


def _op(kind: str, a, b):
    try:
        a, b = _as_sym(a), _as_sym(b)
    except TypeError:
        return NotImplemented
    if a.kind == "imm" and b.kind == "imm":
        return SymbolicScalar(int(_FN[kind](a.args[0], b.args[0])))
    # identities keep the expressions short (x + 0, x * 1, 0 + x)
    if kind in ("+", "-") and b.kind == "imm" and b.args[0] == 0:
        return a
    if kind == "+" and a.kind == "imm" and a.args[0] == 0:
        return b
    if kind in ("*", "//") and b.kind == "imm" and b.args[0] == 1:
        return a
    if kind == "*" and a.kind == "imm" and a.args[0] == 1:
        return b
    hint = None
    if a.hint is not None and b.hint is not None:
        try:
            hint = int(_FN[kind](a.hint, b.hint))
        except ZeroDivisionError:
            hint = None
    return SymbolicScalar._make(kind, (a, b), "", hint)


def _need_value(s: SymbolicScalar, what: str, truth: bool = False):
    """The hint of ``s`` for Python, recorded as a guard of the loop body being traced."""
    if s.kind == "imm":
        return s.args[0]
    if s.depends_on_data() and s.hint is not None and not s.loop_ids() and KERNEL_GUARD_HOOK is not None \
            and KERNEL_GUARD_HOOK(s, truth):
        return s.hint   # a branch on argument data: this trace holds for calls whose data takes it (`loops`)
    if s.depends_on_data() and not (s.hint is not None and s.loop_ids() and GUARD_HOOK is not None
                                    and GUARD_HOOK(s, truth)):
        raise ScalarReadError(
            f"{what} of {s}: it depends on tensor data, which exists only when the kernel runs. Rule: a value read "
            "from a tensor (block_table[b, i]) can be an offset, a loop bound or part of another SymbolicScalar, "
            "but Python cannot branch on it or turn it into an int while tracing. Fix: keep it symbolic (use it as "
            "a view offset or a pypto.loop bound, combine with .min()/.max()), choose per element with "
            "pypto.where, or read it in torch before the call and pass it as a Python argument. (Inside a "
            "pypto.loop, a branch on the loop's index compared with tensor data is allowed: the body is traced "
            "per iteration class, as pypto.is_loop_end(i) on a loop whose bound is read from a tensor)")
    if s.hint is None:
        raise SymbolicValueError(f"{what} of {s}: the symbol has no value. Rule: Python needs a number here, and a "
                                 "named symbol has one only if it was given one. Fix: pypto.SymbolicScalar(name, value), "
                                 "or keep the expression symbolic (an offset, a loop bound, pypto.cond)")
    if GUARD_HOOK is not None:
        GUARD_HOOK(s, truth)   # the loop being traced records the guard (pypto_lab.pto.loops)
    return s.hint


__all__ = ["SymbolicScalar", "ConcreteScalar", "symbolic_scalar", "SymbolicValueError", "evaluate", "is_symbolic", "hint_of"]
