"""The C headers for kernels compiled at run time (CuPy ``RawKernel``/``RawModule``, NVRTC, nvcc).

``cuda_include_dirs()`` writes ``mscclpp/layout.h`` and ``mscclpp/device.cuh`` (the headers this
build embeds, so they match the library that makes the handles) under a cache directory and
returns the include directories to pass (``-I``). ``device.cuh`` is the device API over the
handles (``mscclpp::memory_put``, ``memory_signal``, ``memory_wait``, ``port_put``, …).

NVRTC ships no C++ standard headers; ``layout.h`` includes ``<cstddef>`` and ``<cstdint>``.
``nvrtc=True`` adds a directory holding minimal stand-ins for those two (the fixed-width
integer types, ``size_t``, ``ptrdiff_t`` and ``offsetof``), for NVRTC only: nvcc brings the real
ones.

>>> from mscclpp_rs.kernels import cuda_include_dirs
>>> import os
>>> inc = cuda_include_dirs(nvrtc=True)
>>> sorted(os.listdir(os.path.join(inc[0], "mscclpp"))), sorted(os.listdir(inc[1]))
(['device.cuh', 'layout.h'], ['cstddef', 'cstdint'])
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Dict, List, Optional

from . import _native

__all__ = ["cuda_include_dirs", "headers"]

# Stand-ins for NVRTC, which has no standard library headers: what layout.h uses of them.
_NVRTC_SHIMS: Dict[str, str] = {
    "cstdint": """#pragma once
/* mscclpp_rs: <cstdint> for NVRTC (fixed-width types of the CUDA data model). */
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
namespace std {
using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t;
using ::uint8_t; using ::uint16_t; using ::uint32_t; using ::uint64_t; using ::uintptr_t;
}
""",
    "cstddef": """#pragma once
/* mscclpp_rs: <cstddef> for NVRTC. */
typedef decltype(sizeof(0)) size_t;
typedef decltype((char*)0 - (char*)0) ptrdiff_t;
#ifndef offsetof
/* NVRTC's front end has no __builtin_offsetof; __INTADDR__ makes this a constant expression. */
#define offsetof(type, member) ((size_t)__INTADDR__(&(((type*)0)->member)))
#endif
namespace std { using ::size_t; using ::ptrdiff_t; }
""",
}


def headers() -> Dict[str, str]:
    """``{file name: text}`` of the embedded headers (``layout.h``, ``device.cuh``)."""
    return dict(_native.headers())


def _write_tree(root: str, files: Dict[str, str]) -> None:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)


def cuda_include_dirs(nvrtc: bool = False, cache_dir: Optional[str] = None) -> List[str]:
    """Include directories for a CUDA kernel that includes ``<mscclpp/device.cuh>`` (module
    docs). ``cache_dir`` defaults to ``$XDG_CACHE_HOME/mscclpp_rs`` (``~/.cache``), else the
    temporary directory; files are named by a hash of their contents, so builds do not mix."""
    files = {f"mscclpp/{name}": text for name, text in headers().items()}
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    base = cache_dir or os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if not os.access(os.path.dirname(base.rstrip("/")) or "/", os.W_OK) and cache_dir is None:
        base = tempfile.gettempdir()
    root = os.path.join(base, "mscclpp_rs", f"include-{digest.hexdigest()[:16]}")
    _write_tree(root, files)
    dirs = [root]
    if nvrtc:
        shims = os.path.join(root, "nvrtc")
        _write_tree(shims, _NVRTC_SHIMS)
        dirs.append(shims)
    return dirs
