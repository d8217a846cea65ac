"""Build and load the C++ ``CodecTosaBackend`` ExecuTorch runtime backend.

The shared library is compiled with a single ``g++`` call from the installed
wheels only: executorch's headers and ``libexecutorch.so``, tosa-tools'
headers and static libraries, plus the sources in ``runtime/cpp``. Loading it
(``load()``) registers the backend id ``CodecTosaBackend`` in the registry of
the same ``libexecutorch.so`` that ``executorch.extension.pybindings`` uses.

Builds are cached in ``runtime/_build`` under a name derived from a hash of the
sources, the compiler command and version, and the wheel versions, so a
changed input rebuilds and an unchanged one never does.

    python -m codec_tosa.runtime.native build [--force]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NativeBuildError", "build", "load", "library_path", "payload_hash", "record"]

_HERE = Path(__file__).resolve().parent
SOURCE_DIR = _HERE / "cpp"
BUILD_DIR = _HERE / "_build"
_LIB_STEM = "libcodec_tosa_backend"

# Defines executorch's CMake package asks consumers to compile with
# (lib/cmake/executorch/executorch-config.cmake, EXECUTORCH_COMPILE_DEFINITIONS);
# they change the layout of runtime types, so they must match the wheel.
_ET_DEFINES = (
    "C10_USING_CUSTOM_GENERATED_MACROS",
    "ET_EVENT_TRACER_ENABLED",
    "ET_USE_THREADPOOL",
)

# tosa-tools' static libraries depend on one another in a cycle-free but
# awkward order; linking them as a group lets the linker resolve it.
_TOSA_STATIC_LIBS = (
    "libtosa_reference_model_lib.a",
    "libtosa_serialization_lib.a",
    "libtosa_graph_tools.a",
    "libtosa_infer_shapes.a",
    "libtosa_check_dynamic_shape.a",
    "libflatbuffers.a",
)


class NativeBuildError(RuntimeError):
    """The backend library could not be built or loaded."""


@dataclass(frozen=True)
class _Toolchain:
    executorch_dir: Path
    tosa_prefix: Path
    compiler: str
    compiler_version: str


def _executorch_dir() -> Path:
    # executorch is a namespace package (no __init__.py, __file__ is None).
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise NativeBuildError("the executorch wheel is not installed")
    for location in spec.submodule_search_locations:
        if (Path(location) / "lib" / "libexecutorch.so").is_file():
            return Path(location)
    raise NativeBuildError("executorch is installed but ships no lib/libexecutorch.so")


def _tosa_prefix() -> Path:
    try:
        header = importlib.metadata.distribution("tosa-tools").locate_file("include/model_runner.h")
    except importlib.metadata.PackageNotFoundError as exc:
        raise NativeBuildError("the tosa-tools wheel is not installed") from exc
    path = Path(str(header))
    if not path.is_file():
        raise NativeBuildError(f"tosa-tools ships no {path}")
    return path.parent.parent


def _toolchain() -> _Toolchain:
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise NativeBuildError(f"C++ compiler {compiler!r} not found (set CXX)")
    version = subprocess.run(
        [compiler, "--version"], check=True, capture_output=True, text=True
    ).stdout.splitlines()[0]
    return _Toolchain(_executorch_dir(), _tosa_prefix(), compiler, version)


def _sources() -> list[Path]:
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in {".cpp", ".h"})


def _command(tc: _Toolchain, output: Path) -> list[str]:
    et_include = tc.executorch_dir / "include"
    et_lib = tc.executorch_dir / "lib"
    tosa_include = tc.tosa_prefix / "include"
    tosa_lib = tc.tosa_prefix / "lib64"
    return [
        tc.compiler,
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        # Only the C entry points (registration check, recorder switch) are
        # exported; everything else, including
        # the statically linked reference model (--exclude-libs), stays private
        # so it cannot clash with the copy inside the tosa_reference_model
        # Python extension when both are loaded in one process.
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        *(f"-D{d}" for d in _ET_DEFINES),
        f"-I{SOURCE_DIR}",  # our cfixed.h stand-in
        f"-I{et_include}",
        f"-I{et_include / 'executorch/runtime/core/portable_type/c10'}",
        f"-I{tosa_include}",
        f"-I{tosa_include / 'tosa_serialization_lib'}",
        *(str(p) for p in _sources() if p.suffix == ".cpp"),
        "-o",
        str(output),
        "-Wl,--exclude-libs,ALL",
        "-Wl,--no-undefined",
        "-Wl,--start-group",
        *(str(tosa_lib / name) for name in _TOSA_STATIC_LIBS),
        "-Wl,--end-group",
        f"-L{et_lib}",
        "-lexecutorch",
        f"-Wl,-rpath,{et_lib}",
        "-lpthread",
        "-ldl",
        "-lz",  # external weights' deflated skeletons
    ]


def _fingerprint(tc: _Toolchain) -> str:
    digest = hashlib.sha256()
    for source in _sources():
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    # The command names absolute wheel paths, so a moved venv rebuilds too.
    digest.update("\0".join(_command(tc, Path("OUT"))).encode())
    digest.update(tc.compiler_version.encode())
    for dist in ("executorch", "tosa-tools", "torch"):
        digest.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
    return digest.hexdigest()[:16]


def library_path() -> Path:
    """Where the library for the current sources and toolchain lives (built or not)."""
    return BUILD_DIR / f"{_LIB_STEM}-{_fingerprint(_toolchain())}.so"


def build(force: bool = False) -> Path:
    """Compile the backend library if it is missing (or ``force``); return its path."""
    tc = _toolchain()
    target = BUILD_DIR / f"{_LIB_STEM}-{_fingerprint(tc)}.so"
    if target.is_file() and not force:
        return target
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # Compile to a private temporary name and rename: concurrent builders and
    # readers never see a half-written library.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{_LIB_STEM}-", suffix=".so.tmp", dir=BUILD_DIR)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        result = subprocess.run(_command(tc, tmp), capture_output=True, text=True)
        if result.returncode != 0:
            raise NativeBuildError(
                f"building {target.name} failed ({tc.compiler} exit {result.returncode}):\n"
                + result.stderr[-4000:]
            )
        tmp.chmod(0o755)  # mkstemp's 0600 would hide the library from other users
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    for stale in BUILD_DIR.glob(f"{_LIB_STEM}-*.so"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


_load_lock = threading.Lock()
_loaded: Path | None = None
_handle: ctypes.CDLL | None = None


def load() -> Path:
    """Build if needed and load the library once per process; return its path.

    RTLD_GLOBAL so that the backend joins the process-wide libexecutorch.so
    that the ExecuTorch Python bindings also link.
    """
    global _loaded, _handle
    with _load_lock:
        if _loaded is not None:
            return _loaded
        path = build()
        try:
            handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise NativeBuildError(f"cannot load {path}: {exc}") from exc
        if handle.codec_tosa_backend_registered() != 1:
            raise NativeBuildError(
                f"{path.name} loaded but could not register backend 'CodecTosaBackend' "
                "(already registered by another library in this process?)"
            )
        _loaded, _handle = path, handle
        return path


def record(directory: str | os.PathLike[str] | None) -> None:
    """Make every CodecTosaBackend delegate call record its input and output
    bytes into ``directory`` (an existing directory), or stop recording (None).

    Either way the library's call counter restarts at 0. The file layout is the
    C++ ``Recorder``'s (codec_tosa_backend.cpp); ``executorch_runner.
    run_pte_recorded`` reads it back (docs/DESIGN.md, "Validation").
    """
    load()
    assert _handle is not None
    entry = _handle.codec_tosa_record
    entry.argtypes = [ctypes.c_char_p]
    entry.restype = None
    entry(None if directory is None else os.fsencode(directory))


def payload_hash(payload: bytes) -> str:
    """The FNV-1a 64 hash (16 hex digits) by which a recording names the delegate
    whose processed payload is ``payload``; computed by the library itself so
    that the two sides cannot drift apart."""
    load()
    assert _handle is not None
    entry = _handle.codec_tosa_payload_hash
    entry.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]
    entry.restype = None
    out = ctypes.create_string_buffer(17)
    entry(payload, len(payload), out)
    return out.value.decode()


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codec_tosa.runtime.native")
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="compile the CodecTosaBackend runtime library")
    build_cmd.add_argument("--force", action="store_true", help="rebuild even if cached")
    sub.add_parser("path", help="print where the library for this toolchain lives")
    args = parser.parse_args(argv)
    try:
        if args.command == "path":
            print(library_path())
            return 0
        start = time.perf_counter()
        cached = library_path().is_file() and not args.force
        path = build(force=args.force)
    except NativeBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    how = "cached" if cached else f"built in {time.perf_counter() - start:.1f} s"
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB, {how})")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
