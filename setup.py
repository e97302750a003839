"""Builds gpulock's extension module (gpulock._native) with CMake, from the same build files as
the rest of the project; everything else about the package is in pyproject.toml.

Needs cmake, a C++20 compiler, pybind11 and the libraries in scripts/install-deps (the README's
set-up command installs them). Set GPULOCK_CMAKE_ARGS to pass more options to CMake.
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        output_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGPULOCK_BUILD_TESTS=OFF",
            "-DGPULOCK_BUILD_BENCH=OFF",
            "-DGPULOCK_BUILD_PYTHON=ON",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DGPULOCK_PYTHON_OUTPUT_DIR={output_dir}",
        ]
        try:  # pybind11's CMake files: Debian's are found anyway; a pip-installed one is not
            import pybind11

            configure.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("GPULOCK_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        subprocess.run(
            ["cmake", "--build", str(build_dir), "--target", "gpulock_python_native",
             "--parallel", str(os.cpu_count() or 1)],
            check=True,
        )


setup(
    ext_modules=[Extension("gpulock._native", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # Not build/: that is where the README's CMake build lives.
    options={"build": {"build_base": "build-python"}},
)
