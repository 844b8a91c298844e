"""The `nbx` command."""
from __future__ import annotations

import argparse
import platform
import sys


def _triton_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("triton")  # metadata only: does not import triton
    except PackageNotFoundError:
        return "not installed"


def cmd_info(args) -> int:
    import numpy as np

    import nbxtensor as nbx
    print(f"nbxtensor {nbx.__version__}")
    print(f"Python    {platform.python_version()} ({sys.executable})")
    print(f"NumPy     {np.__version__}")
    triton_version = _triton_version()
    print(f"Triton    {triton_version}")
    print("devices:")
    from .backends.cpu import quant as cpu_quant          # imports no numba
    print(f"  cpu      available; GGUF weights: {cpu_quant.describe()}")
    interp_ok = triton_version != "not installed"
    print(f"  interp   {'available' if interp_ok else 'unavailable: triton is not installed'}")
    try:
        from .backends.cuda import driver
        ok, reason = driver.availability()
        if not ok:
            print(f"  cuda     unavailable: {reason}")
        else:
            ver = driver.driver_version()
            ver = f"{ver // 1000}.{ver % 1000 // 10}"
            print(f"  cuda     driver API {ver}, {driver.device_count()} device(s)")
            for i in range(driver.device_count()):
                try:
                    p = driver.device_properties(i)
                    print(f"  cuda:{i}   {p['name']}, compute capability {p['major']}.{p['minor']}, "
                          f"{p['multiprocessors']} SMs, {p['total_memory'] / 2**30:.1f} GiB, "
                          f"driver API {ver}")
                except Exception as e:  # one bad device does not hide the others
                    print(f"  cuda:{i}   unavailable: {type(e).__name__}: {e}")
    except Exception as e:  # nbx info never shows a traceback
        print(f"  cuda     unavailable: {type(e).__name__}: {e}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, `nbx: error: ...`, exit status 2."""

    def error(self, message):
        print(_one_line(f"nbx: error: {message} (see `{self.prog} --help`)"), file=sys.stderr)
        sys.exit(2)


USER_ERROR, INTERNAL_ERROR = 2, 70        # exit statuses (70: EX_SOFTWARE, a bug of ours)
# what bad input raises: the library's own errors derive from these (ChatTemplateError is a
# ValueError, OutOfMemoryError a MemoryError, NotImplementedOnDevice a NotImplementedError)
_USER_ERRORS = (ValueError, TypeError, LookupError, OverflowError, OSError, MemoryError,
                ImportError, NotImplementedError)
_CUDA_ENVIRONMENT = {2, 3, 46, 100, 101}  # OOM, not initialised, busy, no device, bad device


def _one_line(msg: str, limit: int = 2000) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= limit else msg[:limit] + " ..."


def _is_user_error(e: BaseException) -> bool:
    """Bad input or a machine without what was asked for (no GPU), not a bug of ours."""
    if isinstance(e, _USER_ERRORS):
        return True
    jinja2 = sys.modules.get("jinja2")
    if jinja2 is not None and isinstance(e, jinja2.TemplateError):
        return True
    from .backends.cuda import driver      # ctypes only: libcuda is not opened by the import
    while e is not None:       # an upload failed because no GPU ...
        if isinstance(e, driver.CudaUnavailable) or \
                isinstance(e, driver.CudaError) and e.code in _CUDA_ENVIRONMENT:
            return True
        e = e.__cause__ or e.__context__
    return False


def _message(e: BaseException) -> str:
    if isinstance(e, KeyError) and len(e.args) == 1:
        return f"missing key {e.args[0]!r}"      # str(KeyError) is the bare key
    text = str(e)
    return text if text else type(e).__name__


def report(e: BaseException, debug: bool = False) -> int:
    """One line on stderr for an exception (after its traceback with --debug); the exit
    status: 2 for a user error, 70 for a bug."""
    if debug:
        import traceback
        traceback.print_exception(e)
    if _is_user_error(e):
        print(_one_line(f"nbx: error: {_message(e)}"), file=sys.stderr)
        return USER_ERROR
    hint = "" if debug else " (run with --debug for the traceback)"
    print(_one_line(f"nbx: internal error: {type(e).__name__}: {_message(e)}") + hint,
          file=sys.stderr)
    return INTERNAL_ERROR


def main(argv=None) -> int:
    parser = _Parser(prog="nbx", description="nbxtensor command line")
    debug = dict(action="store_true", help="print the traceback of an error")
    parser.add_argument("--debug", **debug)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="versions and devices")
    p.set_defaults(fn=cmd_info)
    from . import cli_commands
    cli_commands.add_commands(sub)
    for p in sub.choices.values():    # `nbx generate ... --debug` as well as `nbx --debug ...`
        p.add_argument("--debug", **debug, default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return args.fn(args) or 0
    except KeyboardInterrupt:
        print("nbx: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every error leaves as one line (see report)
        return report(e, args.debug)


if __name__ == "__main__":
    sys.exit(main())
