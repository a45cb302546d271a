"""The compiled twin is there wherever it can be built.

setup.py declares the extension `optional`, so an install with no C compiler goes on and runs the
pure-Python twin. The flip side: a C file that stops compiling fails nobody's install, every test of the
compiled paths skips itself, and the suite stays green while the gateway runs several times slower. On a
machine that has a compiler and Python's headers (CI, a developer's), the extension must be built.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sysconfig
from pathlib import Path

import pytest

from gateway.logprobs.compiled import PURE_PYTHON_ENV, fastpath


def test_the_c_extension_is_built_where_a_compiler_and_the_headers_are():
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        pytest.skip(f"{PURE_PYTHON_ENV} turns the compiled twin off")
    # $CC may carry flags (`gcc -m64`, `ccache cc`): its first word is the program.
    compiler = shutil.which((shlex.split(os.environ.get("CC", "")) or ["cc"])[0]) or shutil.which("gcc")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if compiler is None or not headers.exists():
        pytest.skip("no C compiler or no Python headers here: the pure-Python twin runs, as intended")
    assert fastpath is not None, (
        "gateway/logprobs/_fastpath*.c did not build although a compiler and Python.h are here: "
        "`pip install -e . -v` shows the compiler's error (the extension is optional, so the install went on)")
