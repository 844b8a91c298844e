"""Module and Parameter: torch.nn's containers of weights, for inference.

A Module registers what is assigned to it: a Parameter as a parameter, a Module as a child,
a tensor given to `register_buffer` (or an `nn.Buffer`) as a buffer. Its names, its
`state_dict` keys, its `repr` and the errors of `load_state_dict` are torch's, so that code
written for torch (and checkpoints saved by it) work unchanged. There is no autograd:
a Parameter is a Tensor that a Module owns; `requires_grad` is always False.
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict, namedtuple
from collections.abc import Mapping

from ... import dtypes as _dt
from ...device import as_device
from ...grad_mode import _set_data, _set_requires_grad
from ...tensor import Tensor

__all__ = ["Module", "Parameter", "Buffer", "RemovableHandle"]


class Parameter(Tensor):
    """torch.nn.Parameter: a Tensor (the same memory as `data`) that a Module registers as a
    parameter. `requires_grad` is accepted for torch's signature and ignored: nbxtensor has
    no autograd, so `p.requires_grad` is False."""

    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            from ...creation import empty
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: data must be a Tensor, got {type(data).__name__}")
        return cls._make(data._storage, data._shape, data._stride, data._offset, data._dtype)

    def __init__(self, data=None, requires_grad=True):
        pass    # Tensor.__init__ refuses direct construction; __new__ did the work

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self)

    __str__ = __repr__


class Buffer(Tensor):
    """torch.nn.Buffer: assigning one to a Module attribute registers it as a buffer
    (`persistent` says whether state_dict holds it)."""

    __slots__ = ("persistent",)

    def __new__(cls, data=None, *, persistent=True):
        if data is None:
            from ...creation import empty
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Buffer: data must be a Tensor, got {type(data).__name__}")
        b = cls._make(data._storage, data._shape, data._stride, data._offset, data._dtype)
        b.persistent = persistent
        return b

    def __init__(self, data=None, *, persistent=True):
        pass


def _plain(t: Tensor) -> Tensor:
    """The same memory as a plain Tensor (what state_dict hands out, as torch's detach)."""
    return Tensor._make(t._storage, t._shape, t._stride, t._offset, t._dtype)


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """What register_*_hook returns: `remove()` unregisters the hook (also as a context)."""

    _ids = itertools.count()

    def __init__(self, hooks_dict, *extra_dicts):
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.extra_dicts_ref = tuple(weakref.ref(d) for d in extra_dicts)
        self.id = next(RemovableHandle._ids)

    def remove(self) -> None:
        for ref in (self.hooks_dict_ref,) + self.extra_dicts_ref:
            d = ref()
            if d is not None and self.id in d:
                del d[self.id]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _add_hook(hooks, hook, prepend, *flags) -> RemovableHandle:
    """Add `hook` to the dict `hooks` (first with prepend, else last), marked True in each
    table of the (table, marked) `flags` whose `marked` is set; its handle removes it from
    them all."""
    handle = RemovableHandle(hooks, *(table for table, _ in flags))
    hooks[handle.id] = hook
    for table, marked in flags:
        if marked:
            table[handle.id] = True
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def _addindent(s, n):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    return lines[0] + "\n" + "\n".join(n * " " + line for line in lines[1:])


def _check_name(kind, name, module, table):
    """A name `module` may register a `kind` under in `table` (its parameters, buffers or
    submodules): a string, dotless, not empty and not another attribute's (torch's rules)."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if hasattr(module, name) and name not in table:
        raise KeyError(f"attribute '{name}' already exists")


class Module:
    """torch.nn.Module: the base of every layer and model (for inference; no autograd)."""

    training: bool
    _version = 1
    call_super_init = False

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments "
                            f"{args or ''}{kwargs or ''}")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}
        d["_forward_hooks"] = OrderedDict()
        d["_forward_hooks_with_kwargs"] = OrderedDict()      # OrderedDicts: handles hold
        d["_forward_hooks_always_called"] = OrderedDict()    # weak references to them
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_pre_hooks_with_kwargs"] = OrderedDict()

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  f'"forward" function')

    # ------------------------------------------------------------------ registration
    def _registration_table(self, kind, table, name, value, cls, expected) -> dict:
        """The table ("_parameters", "_buffers") that registers `value` as the `kind` `name`,
        after torch's checks: Module.__init__ has run, the name is free, value is a `cls` or
        None (`expected` names cls in the error)."""
        if table not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        _check_name(kind, name, self, self.__dict__[table])
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"cannot assign '{_type_name(value)}' object to {kind} '{name}' "
                            f"({expected} or None required)")
        return self.__dict__[table]

    def register_parameter(self, name: str, param) -> None:
        table = self._registration_table("parameter", "_parameters", name, param, Parameter,
                                         "torch.nn.Parameter")
        table[name] = param

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        table = self._registration_table("buffer", "_buffers", name, tensor, Tensor,
                                         "torch Tensor")
        table[name] = _plain(tensor) if isinstance(tensor, Buffer) else tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module) -> None:
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{_type_name(module)} is not a Module subclass")
        _check_name("module", name, self, self._modules)
        self._modules[name] = module

    register_module = add_module

    def __getattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            t = d.get(table)
            if t is not None and name in t:
                return t[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")

        def remove_from(*tables):
            for t in tables:
                if name in t:
                    del t[name]
            if name in d:
                del d[name]

        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(d["_buffers"], d["_modules"])
            d["_non_persistent_buffers_set"].discard(name)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{_type_name(value)}' as parameter '{name}' "
                                f"(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            if params is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            remove_from(params, d["_buffers"])
            d["_non_persistent_buffers_set"].discard(name)
            d["_modules"][name] = value
        elif "_modules" in d and name in d["_modules"]:
            if value is not None:
                raise TypeError(f"cannot assign '{_type_name(value)}' as child module '{name}' "
                                f"(torch.nn.Module or None expected)")
            d["_modules"][name] = value
        elif isinstance(value, Buffer) or ("_buffers" in d and name in d["_buffers"]):
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{_type_name(value)}' as buffer '{name}' "
                                f"(torch.nn.Buffer, torch.Tensor or None expected)")
            if isinstance(value, Buffer):
                persistent = value.persistent
            else:
                persistent = name not in d["_non_persistent_buffers_set"]
            remove_from(params, d["_modules"])
            self.register_buffer(name, value, persistent)
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d.get(table, ()):
                del d[table][name]
                d["_non_persistent_buffers_set"].discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = list(object.__dir__(self))
        keys += list(self._parameters) + list(self._modules) + list(self._buffers)
        return sorted(k for k in set(keys) if not k[:1].isdigit())

    # ------------------------------------------------------------------ traversal
    def _named_members(self, table, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, value) of each entry of the `table` ("_parameters", "_buffers") of
        this module and, with recurse, of its submodules: named_parameters, named_buffers."""
        memo = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for k, v in getattr(module, table).items():
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (module_prefix + ("." if module_prefix else "") + k, v)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_children(self):
        memo = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in memo:
                memo.add(id(m))
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from m.named_modules(memo, sub, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def get_submodule(self, target: str = "") -> "Module":
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def _get_member(self, target, table, what):
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(f"{mod._get_name()} has no attribute `{name}`")
        if name not in getattr(mod, table):
            raise AttributeError(f"`{name}` is not {what}")
        return getattr(mod, name)

    def get_parameter(self, target: str) -> Parameter:
        return self._get_member(target, "_parameters", "an nn.Parameter")

    def get_buffer(self, target: str) -> Tensor:
        return self._get_member(target, "_buffers", "a buffer")

    # ------------------------------------------------------------------ state dicts
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else _plain(p)
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else _plain(b)

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        if args:    # torch's deprecated positional form: (destination, prefix, keep_vars)
            if len(args) > 3:
                raise TypeError(f"state_dict: takes at most 3 positional arguments, got {len(args)}")
            destination = args[0]
            prefix = args[1] if len(args) > 1 else prefix
            keep_vars = args[2] if len(args) > 2 else keep_vars
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        meta = getattr(destination, "_metadata", None)
        if meta is not None:   # each module's _version, as torch records it
            meta[prefix[:-1]] = {"version": self._version}
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".",
                             keep_vars=keep_vars)
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        assign = local_metadata.get("assign_to_params_buffers", False)
        persistent = {k: v for k, v in self._buffers.items()
                      if k not in self._non_persistent_buffers_set}
        local = {k: v for k, v in itertools.chain(self._parameters.items(), persistent.items())
                 if v is not None}
        for name, param in local.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if not isinstance(value, Tensor):
                error_msgs.append(f'While copying the parameter named "{key}", expected '
                                  f'torch.Tensor or Tensor-like object from checkpoint but '
                                  f'received {type(value)}')
                continue
            if tuple(value.shape) != tuple(param.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{_torch_size(value.shape)} from checkpoint, the shape in "
                                  f"current model is {_torch_size(param.shape)}.")
                continue
            try:
                if assign:
                    if name in self._parameters:
                        setattr(self, name, Parameter(value))
                    else:
                        self._buffers[name] = _plain(value)
                else:
                    param.copy_(value)
            except Exception as ex:  # noqa: BLE001 - torch's message carries the cause
                error_msgs.append(f'While copying the parameter named "{key}", whose dimensions '
                                  f'in the model are {_torch_size(param.shape)} and whose '
                                  f'dimensions in the checkpoint are {_torch_size(value.shape)}, '
                                  f'an exception occurred : {ex.args}.')
        if strict:
            for key in state_dict.keys():
                if isinstance(key, str) and key.startswith(prefix):
                    head = key[len(prefix):].split(".", 1)[0]
                    if head not in self._modules and head not in local:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Copy the checkpoint's tensors into this module's parameters and persistent buffers
        (cast to their dtype, moved to their device); with assign=True take them as they are.
        Returns torch's (missing_keys, unexpected_keys); strict raises RuntimeError listing
        them. A shape mismatch is an error in either mode, as in torch."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing, unexpected, errors = [], [], []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)   # a module's loader may add keys (BatchNorm's)

        def load(module, prefix):
            local_metadata = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                local_metadata["assign_to_params_buffers"] = True
            module._load_from_state_dict(state_dict, prefix, local_metadata, True, missing,
                                         unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    load(child, prefix + name + ".")

        load(self, "")
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ conversion
    def _apply(self, fn):
        for m in self.children():
            m._apply(fn)
        for name, p in self._parameters.items():
            if p is not None:
                new = fn(p)
                if new is not p:
                    _set_data(p, new)   # the same Parameter object: ties and references hold
        for name, b in self._buffers.items():
            if b is not None:
                self._buffers[name] = fn(b)
        return self

    def to(self, *args, **kwargs):
        """to(device), to(dtype), to(device, dtype), to(tensor): moves every parameter and
        buffer; a dtype applies to the floating-point ones only (as in torch)."""
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"to() received an invalid combination of arguments: unexpected "
                            f"keyword arguments {sorted(kwargs)}")
        if len(args) > 3:
            raise TypeError(f"to() takes at most 3 positional arguments, got {len(args)}")
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, _dt.DType) or (isinstance(a, str) and _is_dtype(a)):
                dtype = a
            elif isinstance(a, bool):   # non_blocking, positionally
                continue
            elif a is not None:
                device = a
        if dtype is not None:
            dtype = _dt.as_dtype(dtype, "dtype")
            if not dtype.is_floating_point:
                raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, "
                                f"but got desired dtype={dtype}")
        if device is not None:
            device = as_device(device)

        def convert(t):
            if dtype is not None and t.is_floating_point():
                return t.to(device=device, dtype=dtype) if device is not None else t.to(dtype)
            return t.to(device) if device is not None else t

        return self._apply(convert)

    def cuda(self, device=None):
        return self.to(as_device("cuda" if device is None else device))

    def cpu(self):
        return self.to("cpu")

    def type(self, dst_type):
        dst_type = _dt.as_dtype(dst_type, "dst_type")
        return self._apply(lambda t: t.to(dst_type))

    def _cast_floats(self, dtype):
        return self._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)

    float = _dt.cast_method("float", _dt.float32, "_cast_floats")
    double = _dt.cast_method("double", _dt.float64, "_cast_floats")
    half = _dt.cast_method("half", _dt.float16, "_cast_floats")
    bfloat16 = _dt.cast_method("bfloat16", _dt.bfloat16, "_cast_floats")

    # ------------------------------------------------------------------ modes, hooks, calls
    def train(self, mode: bool = True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True):
        """Only requires_grad_(False) is accepted (a no-op): nbxtensor has no autograd."""
        _set_requires_grad(None, requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """A no-op: nbxtensor has no autograd, so there are no gradients to clear."""

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def register_forward_pre_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False):
        """hook(module, args) -> None or new args (hook(module, args, kwargs) -> None or
        (args, kwargs) with with_kwargs=True), run before forward."""
        return _add_hook(self._forward_pre_hooks, hook, prepend,
                         (self._forward_pre_hooks_with_kwargs, with_kwargs))

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False):
        """hook(module, args, output) -> None or a new output (hook(module, args, kwargs,
        output) with with_kwargs=True), run after forward."""
        return _add_hook(self._forward_hooks, hook, prepend,
                         (self._forward_hooks_with_kwargs, with_kwargs),
                         (self._forward_hooks_always_called, always_call))

    def _call_impl(self, *args, **kwargs):
        d = self.__dict__
        if not (d["_forward_pre_hooks"] or d["_forward_hooks"]):
            return self.forward(*args, **kwargs)
        for hid, hook in list(d["_forward_pre_hooks"].items()):
            if hid in d["_forward_pre_hooks_with_kwargs"]:
                r = hook(self, args, kwargs)
                if r is not None:
                    if not (isinstance(r, tuple) and len(r) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of "
                                           f"(new_args, new_kwargs), but got {r}.")
                    args, kwargs = r
            else:
                r = hook(self, args)
                if r is not None:
                    args = r if isinstance(r, tuple) else (r,)
        called = set()
        try:
            result = self.forward(*args, **kwargs)
            for hid, hook in list(d["_forward_hooks"].items()):
                called.add(hid)
                if hid in d["_forward_hooks_with_kwargs"]:
                    r = hook(self, args, kwargs, result)
                else:
                    r = hook(self, args, result)
                if r is not None:
                    result = r
        except Exception:
            for hid, hook in list(d["_forward_hooks"].items()):
                if hid in d["_forward_hooks_always_called"] and hid not in called:
                    try:
                        if hid in d["_forward_hooks_with_kwargs"]:
                            hook(self, args, kwargs, None)
                        else:
                            hook(self, args, None)
                    except Exception:  # noqa: BLE001,S110 - the forward's error is the one to see
                        pass
            raise
        return result

    __call__ = _call_impl

    # ------------------------------------------------------------------ repr
    def _get_name(self):
        return type(self).__name__

    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({key}): " + _addindent(repr(m), 2) for key, m in self._modules.items()]
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


def _type_name(x) -> str:
    return type(x).__name__


def _torch_size(shape) -> str:
    return f"torch.Size([{', '.join(map(str, shape))}])"


def _is_dtype(name: str) -> bool:
    try:
        _dt.as_dtype(name)
    except (TypeError, ValueError, KeyError):
        return False
    return True
