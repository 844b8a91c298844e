"""Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict (torch.nn's)."""
from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Mapping

from ...tensor import Tensor
from .module import Module, Parameter, _addindent

__all__ = ["Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"]


def _index(idx, n, what):
    idx = operator.index(idx)
    if not -n <= idx < n:
        raise IndexError(f"index {idx} is out of range")
    return idx % n


class _ModuleSequence(Module):
    """Children in order, indexed by position (Sequential, ModuleList): deleting renumbers
    the rest 0..n-1, as torch does."""

    def __setitem__(self, idx, module):
        keys = list(self._modules)
        setattr(self, keys[_index(idx, len(keys), type(self).__name__)], module)

    def __delitem__(self, idx):
        keys = list(self._modules)
        if isinstance(idx, slice):
            for key in keys[idx]:
                delattr(self, key)
        else:
            delattr(self, keys[_index(idx, len(keys), type(self).__name__)])
        self._renumber(self._modules.values())

    def _renumber(self, modules) -> None:
        self.__dict__["_modules"] = OrderedDict((str(i), m) for i, m in enumerate(modules))

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class Sequential(_ModuleSequence):
    """Modules run in order: Sequential(m0, m1, ...) or Sequential(OrderedDict(name=m))."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__(OrderedDict(list(self._modules.items())[idx]))
        keys = list(self._modules)
        return self._modules[keys[_index(idx, len(keys), "Sequential")]]

    def __add__(self, other):
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but "
                             f"{type(other)} is given.")
        ret = Sequential()
        for m in list(self) + list(other):
            ret.append(m)
        return ret

    def __iadd__(self, other):
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but "
                             f"{type(other)} is given.")
        for m in list(other):
            self.append(m)
        return self

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, sequential):
        for m in sequential:
            self.append(m)
        return self

    def insert(self, index, module):
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._renumber(mods)
        return self

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def forward(self, input):  # noqa: A002
        for module in self:
            input = module(input)  # noqa: A001
        return input


class ModuleList(_ModuleSequence):
    """A list of modules, registered as children '0', '1', ..."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self += modules

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self), "ModuleList"))]


    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        combined = ModuleList()
        for i, m in enumerate(list(self) + list(other)):
            combined.add_module(str(i), m)
        return combined

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        if isinstance(modules, (Module, Tensor)) or not hasattr(modules, "__iter__"):
            raise TypeError(f"ModuleList.extend should be called with an iterable, but got "
                            f"{type(modules).__name__}")
        offset = len(self)
        for i, m in enumerate(modules):
            self.add_module(str(offset + i), m)
        return self

    def insert(self, index, module):
        for i in range(len(self._modules), index, -1):
            self._modules[str(i)] = self._modules[str(i - 1)]
        self._modules[str(index)] = module

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def __repr__(self):
        # torch compresses runs of modules with the same repr: "(0-11): 12 x Block(...)"
        list_of_reprs = [repr(m) for m in self]
        if not list_of_reprs:
            return self._get_name() + "()"
        start_end = [[0, 0]]
        reprs = [list_of_reprs[0]]
        for i, r in enumerate(list_of_reprs[1:], 1):
            if r == reprs[-1]:
                start_end[-1][1] += 1
                continue
            start_end.append([i, i])
            reprs.append(r)
        lines = []
        main = self._get_name() + "("
        for (start, end), b in zip(start_end, reprs):
            local = f"({start}): {b}"
            if start != end:
                n = end - start + 1
                local = f"({start}-{end}): {n} x {b}"
            lines.append(_addindent(local, 2))
        main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"

    def forward(self, *args, **kwargs):
        raise NotImplementedError('Module [ModuleList] is missing the required "forward" function')


class _KeyedContainer(Module):
    """The key side of a dict-like container (ModuleDict, ParameterDict): len, iteration,
    `in`, keys() and pop(), over `_key_table()`, the insertion-ordered dict whose keys are
    the container's keys."""

    def _key_table(self) -> dict:
        raise NotImplementedError

    def __len__(self):
        return len(self._key_table())

    def __iter__(self):
        return iter(self._key_table())

    def __contains__(self, key):
        return key in self._key_table()

    def keys(self):
        return self._key_table().keys()

    def pop(self, key):
        v = self[key]
        del self[key]
        return v


class ModuleDict(_KeyedContainer):
    """A dict of modules, registered as children under their keys."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def _key_table(self) -> dict:
        return self._modules

    def clear(self):
        self._modules.clear()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules):
        if isinstance(modules, (OrderedDict, ModuleDict, Mapping)):
            for k, m in modules.items():
                self[k] = m
        else:
            for j, m in enumerate(modules):
                if not hasattr(m, "__len__") or len(m) != 2:
                    raise ValueError(f"ModuleDict update sequence element #{j} has length "
                                     f"{len(m) if hasattr(m, '__len__') else '?'}; 2 is required")
                self[m[0]] = m[1]

    def forward(self, *args, **kwargs):
        raise NotImplementedError('Module [ModuleDict] is missing the required "forward" function')


def _as_param(value):
    return value if isinstance(value, Parameter) or not isinstance(value, Tensor) \
        else Parameter(value)


def _param_line(p) -> str:
    if isinstance(p, Tensor):
        size = "x".join(str(s) for s in p.size())
        dev = f" ({p.device})" if p.device.type == "cuda" else ""
        kind = "Parameter" if isinstance(p, Parameter) else "Tensor"
        return f"{kind} containing: [{p.dtype} of size {size}{dev}]"
    return f"Object of type: {type(p).__name__}"


class ParameterList(Module):
    """A list of parameters, registered as '0', '1', ... (tensors become Parameters)."""

    def __init__(self, values=None):
        super().__init__()
        self.__dict__["_size"] = 0
        if values is not None:
            self += values

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__([self[i] for i in range(len(self))[idx]])
        return getattr(self, str(_index(idx, len(self), "ParameterList")))

    def __setitem__(self, idx, param):
        setattr(self, str(_index(idx, len(self), "ParameterList")), _as_param(param))

    def __len__(self):
        return self._size

    def __iter__(self):
        return iter(self[i] for i in range(len(self)))

    def __iadd__(self, parameters):
        return self.extend(parameters)

    def append(self, value):
        n = len(self)
        self.__dict__["_size"] = n + 1
        setattr(self, str(n), _as_param(value))
        return self

    def extend(self, values):
        if isinstance(values, Tensor) or not hasattr(values, "__iter__"):
            raise TypeError(f"ParameterList.extend should be called with an iterable, but got "
                            f"{type(values).__name__}")
        for v in values:
            self.append(v)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"  ({k}): {_param_line(p)}" for k, p in enumerate(self))

    def forward(self, *args, **kwargs):
        raise RuntimeError("ParameterList should not be called.")


class ParameterDict(_KeyedContainer):
    """A dict of parameters (tensors become Parameters)."""

    def __init__(self, parameters=None):
        super().__init__()
        self.__dict__["_keys"] = {}
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        return getattr(self, key)

    def __setitem__(self, key, value):
        self._keys[key] = None
        setattr(self, key, _as_param(value))

    def __delitem__(self, key):
        del self._keys[key]
        delattr(self, key)

    def _key_table(self) -> dict:
        return self._keys

    def items(self):
        return ((k, self[k]) for k in self._keys)

    def values(self):
        return (self[k] for k in self._keys)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def clear(self):
        for k in list(self._keys):
            del self[k]

    def update(self, parameters):
        items = parameters.items() if isinstance(parameters, (Mapping, ParameterDict)) \
            else parameters
        for k, v in items:
            self[k] = v

    def extra_repr(self) -> str:
        return "\n".join(f"  ({k}): {_param_line(p)}" for k, p in self.items())

    def forward(self, *args, **kwargs):
        raise RuntimeError("ParameterDict should not be called.")
