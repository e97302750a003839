"""gpulock's PEP 517 build backend: `pip install .` builds, with CMake, the same targets as the
rest of the project (the extension module gpulock._native, the `gpulock` command and the
`gpulock-serve` program it runs for `gpulock serve`) and packs them with the Python package
into a wheel, using the standard library alone.

Why not setuptools: its wheels need the `wheel` package, which a virtualenv of a pyenv, conda
or self-built Python does not have, and with no package index to fetch it from, `pip install .`
failed there ("invalid command 'bdist_wheel'"). This backend needs nothing to be installed
first, so pip's isolated build works offline under any Python >= 3.9; what the build needs
(cmake, a C++20 compiler, pybind11 and the libraries of scripts/install-deps) comes from Debian.

The wheel installs:
  <site-packages>/gpulock/...           the package, with _native.<abi>.so
  <prefix>/bin/gpulock                  the command line, built from the same sources
  <prefix>/bin/gpulock-gpu              GPU.py's replacement (a console script)
  <prefix>/libexec/gpulock/gpulock-serve  what `gpulock serve` runs (found beside bin/)

Set GPULOCK_CMAKE_ARGS to pass more options to CMake (e.g. a compiler, or -O0 for a quick
check). The metadata comes from pyproject.toml's [project] table.
"""

import base64
import hashlib
import os
import pathlib
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "gpulock"


# -- metadata ---------------------------------------------------------------------------------

def _project():
    """pyproject.toml's [project] and [project.scripts] tables: tomllib where there is one
    (Python >= 3.11), else the file's own simple form (`key = "text"`, lists of strings)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:
        tomllib = None
    if tomllib is not None:
        project = tomllib.loads(text)["project"]
        return project, project.get("scripts", {})
    tables, table, pending = {}, None, None
    for line in text.splitlines():
        line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        if pending is not None:
            key, items = pending
            items += re.findall(r'"([^"]*)"', line)
            if line.endswith("]"):
                tables[table][key], pending = items, None
            continue
        header = re.fullmatch(r"\[([^\]]+)\]", line)
        if header:
            table = header.group(1)
            tables.setdefault(table, {})
            continue
        key, _, value = (part.strip() for part in line.partition("="))
        key = key.strip('"')
        if value.startswith("[") and not value.endswith("]"):
            pending = (key, re.findall(r'"([^"]*)"', value))
        elif value.startswith("["):
            tables[table][key] = re.findall(r'"([^"]*)"', value)
        elif value.startswith('"'):
            tables[table][key] = value.strip('"')
        else:
            tables[table][key] = value
    return tables["project"], tables.get("project.scripts", {})


def _metadata():
    project, _ = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % project["name"],
             "Version: %s" % project["version"], "Summary: %s" % project["description"],
             "Requires-Python: %s" % project["requires-python"]]
    lines += ["Classifier: %s" % c for c in project.get("classifiers", [])]
    readme = project.get("readme")
    body = ""
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        body = "\n" + (ROOT / readme).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n" + body


def _tag():
    """cpXY-cpXY-<platform>: the wheel holds an extension module and programs for this
    interpreter and machine only."""
    version = "cp%d%d" % sys.version_info[:2]
    abi = version + getattr(sys, "abiflags", "")
    platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return "%s-%s-%s" % (version, abi, platform)


def _dist_info_name():
    project, _ = _project()
    return "%s-%s" % (re.sub(r"[-_.]+", "_", project["name"]), project["version"])


# -- building ---------------------------------------------------------------------------------

def _build(build_dir):
    """Configures and builds the extension and the programs; returns where each landed."""
    native_dir = build_dir / "native"
    configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir),
                 "-DCMAKE_BUILD_TYPE=Release", "-DGPULOCK_BUILD_TESTS=OFF",
                 "-DGPULOCK_BUILD_BENCH=OFF", "-DGPULOCK_BUILD_PYTHON=ON",
                 "-DPython_EXECUTABLE=%s" % sys.executable,
                 "-DGPULOCK_PYTHON_OUTPUT_DIR=%s" % native_dir]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    configure += shlex.split(os.environ.get("GPULOCK_CMAKE_ARGS", ""))
    subprocess.run(configure, check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", str(build_dir), "--parallel", str(os.cpu_count() or 1),
                    "--target", "gpulock_python_native", "gpulock_cli", "gpulock_serve_cli"],
                   check=True, stdout=sys.stderr)
    natives = sorted(native_dir.glob("_native*.so"))
    if len(natives) != 1:
        raise RuntimeError("expected one extension module in %s, found %s" % (native_dir, natives))
    return natives[0], build_dir / "gpulock", build_dir / "gpulock-serve"


def _console_scripts():
    _, scripts = _project()
    return "[console_scripts]\n" + "".join("%s = %s\n" % item for item in scripts.items())


class _Wheel:
    """A wheel being written: files and their RECORD lines."""

    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, name, data, executable=False):
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        # A regular file's whole mode: installers set the executable bits only for S_IFREG.
        info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append("%s,sha256=%s,%d" % (name, digest, len(data)))

    def close(self, record_name):
        self.record.append("%s,," % record_name)
        self.zip.writestr(zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0)),
                          "\n".join(self.record) + "\n")
        self.zip.close()


def _package_files():
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (
                ".py", ".pyi", ".typed"):
            yield path


# -- PEP 517 hooks ----------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = pathlib.Path(metadata_directory) / (_dist_info_name() + ".dist-info")
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata(), encoding="utf-8")
    (dist_info / "entry_points.txt").write_text(_console_scripts(), encoding="utf-8")
    return dist_info.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _dist_info_name()
    # One build directory per interpreter, in the checkout's ignored build-python/.
    build_dir = ROOT / "build-python" / ("cmake-" + _tag())
    native, command, server = _build(build_dir)
    filename = "%s-%s.whl" % (name, _tag())
    wheel = _Wheel(pathlib.Path(wheel_directory) / filename)
    for path in _package_files():
        wheel.add("gpulock/" + path.relative_to(PACKAGE).as_posix(), path.read_bytes())
    wheel.add("gpulock/" + native.name, native.read_bytes(), executable=True)
    data = name + ".data"
    wheel.add(data + "/scripts/gpulock", command.read_bytes(), executable=True)
    wheel.add(data + "/data/libexec/gpulock/gpulock-serve", server.read_bytes(), executable=True)
    dist_info = name + ".dist-info"
    wheel.add(dist_info + "/METADATA", _metadata().encode("utf-8"))
    wheel.add(dist_info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: gpulock_build\n"
                                     "Root-Is-Purelib: false\nTag: %s\n" % _tag()).encode())
    wheel.add(dist_info + "/entry_points.txt", _console_scripts().encode("utf-8"))
    wheel.close(dist_info + "/RECORD")
    return filename


def build_sdist(sdist_directory, config_settings=None):
    """The source tree as git knows it (tracked files), else less build outputs and caches."""
    name = _dist_info_name()
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                                capture_output=True).stdout.decode().split("\0")
        files = [ROOT / f for f in listed if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = re.compile(r"^(build[^/]*|\.git|\.venv|\.cache)(/|$)|__pycache__|\.pyc$")
        files = [p for p in sorted(ROOT.rglob("*"))
                 if p.is_file() and not skip.search(p.relative_to(ROOT).as_posix())]
    filename = name + ".tar.gz"
    with tarfile.open(pathlib.Path(sdist_directory) / filename, "w:gz") as archive:
        for path in files:
            archive.add(path, arcname="%s/%s" % (name, path.relative_to(ROOT).as_posix()))
        info = tarfile.TarInfo("%s/PKG-INFO" % name)
        metadata = _metadata().encode("utf-8")
        info.size = len(metadata)
        import io
        archive.addfile(info, io.BytesIO(metadata))
    return filename
