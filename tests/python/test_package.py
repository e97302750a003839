"""The package as built (<build>/python): its public names, its version (equal to
pyproject.toml's and CMakeLists.txt's), its typing files, and the extension's stubs
(_native.pyi) matching the extension."""

import ast
import inspect
import pathlib

import gpulock
import gpulock._native as native
import gpulock.compat
from conftest import REPO, package_version_sources


def test_public_names_exist():
    for name in gpulock.__all__:
        assert hasattr(gpulock, name), name
    for name in gpulock.compat.__all__:
        assert hasattr(gpulock.compat, name), name


def test_version():
    py_version, cmake_version = package_version_sources()
    assert gpulock.__version__ == py_version == cmake_version
    assert native.__version__ == gpulock.__version__


def test_typing_files_beside_the_package():
    here = pathlib.Path(gpulock.__file__).parent
    assert (here / "py.typed").is_file()
    assert (here / "_native.pyi").is_file()


def stub_of_native():
    return ast.parse((REPO / "python" / "gpulock" / "_native.pyi").read_text())


def test_native_stub_names_exist():
    tree = stub_of_native()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert callable(getattr(native, node.name, None)), node.name
        elif isinstance(node, ast.ClassDef):
            cls = getattr(native, node.name)
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    assert hasattr(cls, member.name), "%s.%s" % (node.name, member.name)


def test_native_stub_keywords_of_acquire_match():
    tree = stub_of_native()
    (pool,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Pool"]
    (acquire,) = [n for n in pool.body if isinstance(n, ast.FunctionDef) and n.name == "acquire"]
    stub_names = [a.arg for a in acquire.args.kwonlyargs]
    doc = inspect.getdoc(native.Pool.acquire) or ""
    signature = doc.splitlines()[0]
    for name in stub_names:
        assert " %s:" % name in signature, (name, signature)
    assert signature.count(":") - 1 == len(stub_names), signature  # no keyword missing
