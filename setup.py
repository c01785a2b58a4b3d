"""Builds the Python package `omni` with CMake (metadata in pyproject.toml).

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation .

The native module omni._C is the CMake target `omni_python`; it is built in
build-pip/ (configured without LibTorch, tests or benchmarks: the module never
links LibTorch, so it works with the user's own torch) and copied into the
package together with libomni_core, which it finds next to itself
(RUNPATH $ORIGIN). Set OMNI_CMAKE_BUILD_DIR to an already configured build
directory (e.g. build/) to build the module there instead. The interpreter the
module is built for is the one running this script.
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    """Runs CMake for the omni_python target instead of compiling sources."""

    def build_extension(self, ext):
        build_dir = os.environ.get("OMNI_CMAKE_BUILD_DIR") or os.path.join(ROOT, "build-pip")
        build_dir = os.path.abspath(build_dir)
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.check_call(
                ["cmake", "-S", ROOT, "-B", build_dir, *generator,
                 "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 "-DOMNI_BUILD_TORCH=OFF", "-DOMNI_BUILD_TESTS=OFF",
                 "-DOMNI_BUILD_BENCHMARKS=OFF", "-DOMNI_BUILD_PYTHON=ON",
                 f"-DOMNI_PYTHON_EXECUTABLE={sys.executable}"]
            )
        jobs = os.environ.get("OMNI_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(
            ["cmake", "--build", build_dir, "--target", "omni_python", "-j", jobs])

        built = glob.glob(os.path.join(build_dir, "python", "omni", "_C*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one omni/_C*.so under {build_dir}/python, found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(built[0], target)
        # libomni_core under its SONAME (what _C asks the loader for).
        for lib in glob.glob(os.path.join(build_dir, "lib", "libomni_core.so.*")):
            name = os.path.basename(lib)
            if name.count(".") == 3:  # libomni_core.so.MAJOR.MINOR
                shutil.copy2(os.path.realpath(lib), os.path.join(os.path.dirname(target), name))


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
