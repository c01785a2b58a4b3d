"""Builds the Python package `omni` with CMake (metadata in pyproject.toml).

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation .

The native module omni._C is the CMake target `omni_python`; it is built in
build-pip/ (without tests or benchmarks: the module never links LibTorch, so it
works with the user's own torch) and copied into the package together with
libomni_core, which it finds next to itself (RUNPATH $ORIGIN). Set
OMNI_CMAKE_BUILD_DIR to an already configured build directory (e.g. build/) to
build the module there instead. The interpreter the module is built for is the
one running this script.

Where that interpreter's torch is older than 2.4, whose Python TCPStore binding
can crash a process with threads (PyTorch #125990), build-pip/ is configured
with LibTorch as well (torch's own CMake package, found through
torch.utils.cmake_prefix_path or the system's): the optional module
omni._torch_C then serves tcp:// and env:// stores with c10d's C++ client, and
is copied into the package with libomni_torch and omni/_torch_build.py (which
libtorch_cpu it links; omni._torch_store loads it only into a process whose
torch is that file). OMNI_PIP_TORCH=1 asks for it with any torch, 0 never;
where LibTorch's CMake package is not found, or omni._torch_C does not build
against it (a torch built with the pre-C++11 string ABI is not tried), the
build goes on without it and says so.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _torch_cmake():
    """(wanted, prefix): whether to build omni._torch_C, and torch's CMake
    prefix where it has one (else CMake searches the system's)."""
    choice = os.environ.get("OMNI_PIP_TORCH", "auto")
    if choice == "0":
        return False, None
    try:
        import torch
        import torch.utils
    except Exception:  # no torch, or one that does not import: omni does not need it
        return False, None
    release = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if choice != "1" and release >= (2, 4):
        return False, None  # its TCPStore binding holds the GIL where it must
    if not getattr(torch, "compiled_with_cxx11_abi", lambda: False)():
        return False, None  # libomni_core's std::string is not that LibTorch's
    prefix = getattr(torch.utils, "cmake_prefix_path", None)
    return True, prefix if prefix and os.path.isdir(prefix) else None


def _configure(build_dir, torch_on, torch_prefix):
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    cached = os.path.exists(os.path.join(build_dir, "CMakeCache.txt"))
    flags = [f"-DOMNI_BUILD_TORCH={'ON' if torch_on else 'OFF'}"]
    if torch_prefix:
        flags.append(f"-DCMAKE_PREFIX_PATH={torch_prefix}")
    return subprocess.call(
        ["cmake", "-S", ROOT, "-B", build_dir, *([] if cached else generator),
         "-DCMAKE_BUILD_TYPE=RelWithDebInfo", *flags, "-DOMNI_BUILD_TESTS=OFF",
         "-DOMNI_BUILD_BENCHMARKS=OFF", "-DOMNI_BUILD_PYTHON=ON",
         f"-DOMNI_PYTHON_EXECUTABLE={sys.executable}"])


class CMakeBuild(build_ext):
    """Runs CMake for the omni_python target instead of compiling sources."""

    def build_extension(self, ext):
        given = os.environ.get("OMNI_CMAKE_BUILD_DIR")
        build_dir = os.path.abspath(given or os.path.join(ROOT, "build-pip"))
        torch_on = False
        if not given:
            torch_on, torch_prefix = _torch_cmake()
            if torch_on and _configure(build_dir, True, torch_prefix) != 0:
                print("omni: LibTorch's CMake package was not found: building without "
                      "omni._torch_C (tcp:// stores go through torch's Python binding)",
                      file=sys.stderr)
                torch_on = False
            if not torch_on and _configure(build_dir, False, None) != 0:
                raise RuntimeError(f"cmake could not configure {build_dir}")
        jobs = os.environ.get("OMNI_BUILD_JOBS", str(os.cpu_count() or 2))
        build = ["cmake", "--build", build_dir, "--target", "omni_python", "-j", jobs]
        if subprocess.call(build) != 0:
            if given or not torch_on:
                raise RuntimeError(f"building omni_python in {build_dir} failed")
            print("omni: building omni._torch_C against LibTorch failed: building without it "
                  "(tcp:// stores go through torch's Python binding)", file=sys.stderr)
            if _configure(build_dir, False, None) != 0:
                raise RuntimeError(f"cmake could not configure {build_dir}")
            subprocess.check_call(build)

        built = glob.glob(os.path.join(build_dir, "python", "omni", "_C*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one omni/_C*.so under {build_dir}/python, found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(built[0], target)
        package = os.path.dirname(target)
        # (Nothing of an earlier build's LibTorch part stays in the package.)
        for stale in glob.glob(os.path.join(package, "_torch_C*.so")) + glob.glob(
                os.path.join(package, "libomni_torch.so*")) + glob.glob(
                os.path.join(package, "_torch_build.py")):
            os.remove(stale)
        # omni._torch_C where this build has it, with the record of the
        # libtorch_cpu it links (omni._torch_store.native_api reads it).
        with open(os.path.join(build_dir, "CMakeCache.txt")) as cache:
            built_with_torch = "OMNI_BUILD_TORCH:BOOL=ON\n" in cache.read()
        torch_c = (glob.glob(os.path.join(build_dir, "python", "omni", "_torch_C*.so"))
                   if built_with_torch else [])  # (not one left from an earlier build)
        if torch_c:
            torch_c.append(os.path.join(build_dir, "python", "omni", "_torch_build.py"))
        for path in torch_c:
            shutil.copy2(path, os.path.join(package, os.path.basename(path)))
        # libomni_core (and libomni_torch with _torch_C) under their SONAMEs
        # (what the modules ask the loader for).
        libs = ["libomni_core"] + (["libomni_torch"] if torch_c else [])
        for stem in libs:
            for lib in glob.glob(os.path.join(build_dir, "lib", stem + ".so.*")):
                name = os.path.basename(lib)
                if name.count(".") == 3:  # libomni_X.so.MAJOR.MINOR
                    shutil.copy2(os.path.realpath(lib), os.path.join(package, name))


setup(
    package_dir={"omni": "python/omni"},
    packages=["omni"],
    package_data={"omni": ["_C.pyi", "py.typed"]},
    ext_modules=[Extension("omni._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build-pip/setuptools"},
             "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
