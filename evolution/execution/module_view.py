"""Object-level guards of a memory program's namespace, installed by the sandbox child
(:mod:`memgym.evolution.execution.sandbox_child`) beside its audit hook: the program never holds a module
object outside its allowed imports, however it names the attribute.

- Every module the program imports is a **view** (:meth:`NamespaceGuard.view`): a fresh module
  holding a copy of the real module's namespace in which each allowed module is itself a view and
  every other module object (``numpy._pytesttester.os``, ``typing.sys``, ``dataclasses._thread``),
  ``__builtins__``, ``__loader__``, ``__spec__`` and the module's own ``__getattr__`` are left out.
  A name missing from the copy is looked up on the real module and screened the same way, so
  reaching a forbidden module by attribute, ``getattr``, ``vars()`` or ``__dict__`` is a violation
  (or a plain missing key), never the module.
- The program's ``getattr`` refuses :data:`~memgym.evolution.execution.static_check.INTROSPECTION_ATTRS`
  (the computed-name route around the static check) and screens module results;
  ``operator.attrgetter``, ``operator.methodcaller`` and ``string.Formatter`` (the standard
  library's other computed-attribute readers) refuse the same names.

These are a first filter with clear messages; the boundary stays the kernel
(:mod:`memgym.evolution.execution.confine`).
"""
from __future__ import annotations

import builtins
import operator
import string
import types
from collections.abc import Callable

from memgym.evolution.execution.static_check import INTROSPECTION_ATTRS

#: Names a view never copies (the real module's import machinery and builtins).
HIDDEN = frozenset({"__builtins__", "__loader__", "__spec__", "__getattr__", "__cached__"})

_REAL: dict[str, tuple] = {}  # view name -> (real module, its guard); never handed to the program


class NamespaceGuard:
    """Views of the modules whose top-level name is in ``allowed``; ``violate(what)`` records a
    violation and raises (it must not return)."""

    def __init__(self, allowed: frozenset, violate: Callable[[str], None]):
        self.allowed, self.violate = frozenset(allowed), violate
        self._views: dict[str, types.ModuleType] = {}
        self._gadgets = _gadgets(self.refuse_names)

    def refuse_names(self, names, what: str) -> None:
        """A violation when a (dotted) name in ``names`` is a forbidden attribute."""
        for n in names:
            for part in str(n).replace("[", ".").replace("]", ".").split("."):
                if part in INTROSPECTION_ATTRS:
                    self.violate(f"{what}({n!r}) is not allowed")

    def screen(self, value, where: str):
        """``value``, or the view of an allowed module; a violation for any other module."""
        if not isinstance(value, types.ModuleType):
            return value
        name = str(getattr(value, "__name__", "?"))
        if self._views.get(name) is value:
            return value
        if name.partition(".")[0] in self.allowed:
            return self.view(value)
        self.violate(f"{where} is the module {name!r}, outside the allowed imports")
        return None

    def view(self, real: types.ModuleType) -> types.ModuleType:
        """The view of allowed module ``real`` (one per module, built on first use)."""
        name = str(real.__name__)
        if name in self._views:
            return self._views[name]
        v = types.ModuleType(name, getattr(real, "__doc__", None))
        self._views[name], _REAL[name] = v, (real, self)
        ns = vars(v)
        for k, x in list(vars(real).items()):
            if k in HIDDEN:
                continue
            if isinstance(x, types.ModuleType):
                top = str(getattr(x, "__name__", "")).partition(".")[0]
                if top not in self.allowed:
                    continue
                x = self.view(x)
            ns[k] = self._gadgets.get((name, k), x)
        ns["__getattr__"] = _Fallback(name)
        return v

    def guarded_getattr(self) -> Callable:
        """The program's ``getattr``."""
        real_getattr = builtins.getattr

        def getattr(obj, name, *default):  # noqa: A001 - replaces the builtin in the program's namespace
            if isinstance(name, str) and name in INTROSPECTION_ATTRS:
                self.violate(f"getattr(..., {name!r}) is not allowed")
            return self.screen(real_getattr(obj, name, *default), f"getattr(..., {name!r})")

        return getattr


class _Fallback:
    """A view's module ``__getattr__`` (PEP 562): a name the copy lacks, read on the real module
    and screened (a submodule imported later, a lazy attribute, or a forbidden module)."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __call__(self, attr: str):
        real, guard = _REAL[self._name]
        if attr in HIDDEN:
            raise AttributeError(f"module {self._name!r} has no attribute {attr!r}")
        return guard.screen(getattr(real, attr), f"{self._name}.{attr}")


def _gadgets(refuse: Callable) -> dict:
    """The guarded ``operator.attrgetter``, ``operator.methodcaller`` and ``string.Formatter``."""

    def attrgetter(*names):
        refuse(names, "operator.attrgetter")
        return operator.attrgetter(*names)

    def methodcaller(name, *args, **kwargs):
        refuse([name], "operator.methodcaller")
        return operator.methodcaller(name, *args, **kwargs)

    class Formatter(string.Formatter):
        def get_field(self, field_name, args, kwargs):
            refuse([field_name], "string.Formatter field")
            return super().get_field(field_name, args, kwargs)

    return {("operator", "attrgetter"): attrgetter, ("operator", "methodcaller"): methodcaller,
            ("string", "Formatter"): Formatter}
