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
    print("  cpu      available")
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="nbx", description="nbxtensor command line")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="versions and devices")
    p.set_defaults(fn=cmd_info)
    from . import cli_commands
    cli_commands.add_commands(sub)
    args = parser.parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
