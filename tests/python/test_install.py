"""Installing the package offline, as a new user would: `pip install .` into a fresh virtualenv
made from Debian's /usr/bin/python3 alone (no system site packages, pip's own isolated build,
no package index), and again into one made from the first `python3` on PATH when that is
another interpreter (a pyenv or conda Python, as ML labs use). The build backend
(packaging/python/gpulock_build.py) needs nothing but the standard library, and the wheel
carries the `gpulock` command built from the same sources. Then, with only the virtualenv's
bin/ and /usr/bin on PATH and from a directory outside the repository: the installed package
(not the build tree's) is imported and leases a GPU, its typing files are there, its version
agrees with pyproject.toml and CMakeLists.txt; `gpulock status`, `gpulock run` and `gpulock
serve` run, and `gpulock-gpu --get`, `--release` and `--log` work.

Slow (it compiles the library, the extension and the command): unoptimised (-O0, through
GPULOCK_CMAKE_ARGS, the hook the backend documents), since what is checked is the install, not
the optimiser. The second interpreter reuses the first's build when it has the same version."""

import json
import os
import re
import pathlib
import shutil
import subprocess

import pytest

from conftest import REPO, package_version_sources

INSTALL_TIMEOUT = 840
# What the build backend passes on to CMake: the Release build (NDEBUG), without its
# optimisation.
UNOPTIMISED = "'-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG'"


def copy_checkout(destination):
    """Copies the files git knows of (tracked, and untracked but not ignored: work in
    progress) as they are in the working tree; without git, the tree less build outputs."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], capture_output=True, check=True, timeout=120).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        def build_outputs(directory, names):
            top = pathlib.Path(directory) == REPO
            return [n for n in names if n == "__pycache__" or n.endswith(".egg-info") or
                    (top and (n.startswith("build") or n in (".git", ".venv")))]
        shutil.copytree(REPO, destination, symlinks=True, ignore=build_outputs)
        return sum(1 for _ in destination.rglob("*"))
    copied = 0
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_file():  # deleted in the working tree, or a submodule
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += 1
    return copied


def clean_env(**extra):
    """No PYTHONPATH (it leads to the build tree's package), no virtualenv of the caller's,
    no package index (offline), no user site or pip cache written outside the test."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_INDEX_URL",
                        "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")}
    env.update({"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PIP_NO_CACHE_DIR": "1", "PYTHONNOUSERSITE": "1"})
    env.update(extra)
    return env


USE_INSTALLED = r'''
import glob, json, os, sys
import gpulock, gpulock._native
from gpulock.compat import GPUScheduler, lock_gpu, safe_gpu
here = os.path.dirname(gpulock.__file__)
with gpulock.lease(count=2, label="installed") as lease:
    leased = {"indices": lease.indices, "cvd": os.environ["CUDA_VISIBLE_DEVICES"]}
    status = [g.state for g in gpulock.status().gpus]
print(json.dumps({
    "file": gpulock.__file__,
    "native": gpulock._native.__file__,
    "version": gpulock.__version__,
    "py_typed": os.path.isfile(os.path.join(here, "py.typed")),
    "pyi": sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "**", "*.pyi"),
                                                              recursive=True)),
    "modules": sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "**", "*.py"),
                                                                  recursive=True)),
    "leased": leased,
    "status": status,
    "prefix": sys.prefix,
}))
'''


SHELL_CHECK = r"""
set -e
gpulock status | head -1
gpulock run -n 1 -- sh -c 'echo "run: $CUDA_VISIBLE_DEVICES"'
GPUID=$(gpulock-gpu --get)
echo "get: $GPUID"
gpulock-gpu --release "$GPUID"
gpulock-gpu --log
gpulock serve --listen 127.0.0.1:0 2> serve.log &
for i in $(seq 600); do grep -q listening serve.log && break; sleep 0.1; done
kill %1 && wait %1 || true
cat serve.log
"""


def other_python3():
    """The first `python3` on PATH when it is not Debian's (a pyenv shim, conda), else None."""
    found = shutil.which("python3")
    if found is None:
        return None
    real = subprocess.run([found, "-c", "import sys; print(sys.executable)"],
                          capture_output=True, text=True, timeout=60)
    if real.returncode != 0 or real.stdout.strip().startswith("/usr/bin/"):
        return None
    return found


def install_and_use(gl, tmp_path, source, python, name):
    venv = tmp_path / name
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300, env=clean_env())
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", str(source)],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT, cwd=tmp_path,
        env=clean_env(GPULOCK_CMAKE_ARGS=UNOPTIMISED))
    assert install.returncode == 0, "pip install failed\nstdout:\n%s\nstderr:\n%s" % (
        install.stdout[-6000:], install.stderr[-6000:])

    elsewhere = tmp_path / (name + "-elsewhere")
    elsewhere.mkdir()
    # Only the virtualenv's commands and the system's: no build tree, no GPULOCK_BINARY.
    path = "%s:/usr/bin:/bin" % (venv / "bin")
    env = {k: v for k, v in clean_env(GPULOCK_FAKE_GPUS="3", PATH=path).items()
           if k != "GPULOCK_BINARY"}
    use = subprocess.run([str(venv / "bin" / "python"), "-c", USE_INSTALLED],
                         capture_output=True, text=True, timeout=120, cwd=elsewhere, env=env)
    assert use.returncode == 0, use.stderr
    found = json.loads(use.stdout)
    site = pathlib.Path(found["file"]).resolve()
    assert str(site).startswith(str(venv.resolve()) + os.sep), found["file"]
    assert str(pathlib.Path(found["native"]).resolve()).startswith(str(venv.resolve()) + os.sep)
    assert found["prefix"] == str(venv)
    assert found["py_typed"] is True
    package = REPO / "python" / "gpulock"
    expected_pyi = sorted(str(p.relative_to(package)) for p in package.rglob("*.pyi"))
    assert expected_pyi and found["pyi"] == expected_pyi
    expected_modules = sorted(str(p.relative_to(package)) for p in package.rglob("*.py"))
    assert found["modules"] == expected_modules
    py_version, cmake_version = package_version_sources()
    assert found["version"] == py_version == cmake_version
    assert found["leased"] == {"indices": [0, 1], "cvd": "0,1"}
    assert found["status"] == ["leased", "leased", "free"]
    # The lease ended with the with block (and the process): the CLI sees the GPUs free.
    assert gl.no_wait_run("0,1,2", env=gl.env(GPULOCK_FAKE_GPUS="3")) == 0

    # Every command of the docs from the virtualenv alone, in a session of its own.
    shell = subprocess.run(["setsid", "-w", "bash", "-c", SHELL_CHECK], capture_output=True,
                           text=True, timeout=300, cwd=elsewhere, env=env)
    assert shell.returncode == 0, shell.stdout + shell.stderr
    lines = shell.stdout.splitlines()
    assert "3 simulated GPUs" in lines[0], lines
    assert lines[1:4] == ["run: 0", "get: 0", "GPU 0 released."], lines
    # --log, from the journal: the run's lease and the --get's, each acquired and released.
    assert [line for line in lines if re.search(r": GPU 0 (acquired|released) by PID \d+\.$",
                                                line)], lines
    assert "gpulock serve: listening on http://127.0.0.1:" in shell.stdout
    assert os.access(venv / "bin" / "gpulock", os.X_OK)
    assert os.access(venv / "libexec" / "gpulock" / "gpulock-serve", os.X_OK)


@pytest.mark.hang_guard(2 * INSTALL_TIMEOUT + 120)
def test_pip_install_offline_into_a_fresh_virtualenv(gl, tmp_path):
    source = tmp_path / "src"
    assert copy_checkout(source) > 0
    assert (source / "pyproject.toml").is_file()
    assert not (source / "setup.py").exists()  # nothing for setuptools to need `wheel` for
    install_and_use(gl, tmp_path, source, "/usr/bin/python3", "venv")
    other = other_python3()
    if other is not None:  # a pyenv or conda python3 first on PATH: what labs run
        install_and_use(gl, tmp_path, source, other, "venv-other")

    # The build wrote nothing into the checkout.
    assert not (REPO / "python" / "gpulock" / "_native.so").exists()
    leftovers = [p.name for p in (REPO / "python" / "gpulock").iterdir()
                 if p.suffix == ".so"]
    assert leftovers == []
