"""nativelab.cpp_build: C++ extensions built on first use, cached by content, reused across processes."""

import os
import subprocess
import sys
import textwrap

import pytest

from nativelab import cpp_build

# A Python-C-API module: compiles in about a second (no torch headers).
SRC = textwrap.dedent("""
    #include <Python.h>
    static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, "nl_cpp_build_probe", nullptr, -1, methods};
    PyMODINIT_FUNC PyInit_nl_cpp_build_probe() { return PyModule_Create(&def); }
""")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cpp_build.ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _source(tmp_path, answer: int):
    src = tmp_path / "probe.cpp"
    src.write_text(SRC.replace("ANSWER", str(answer)))
    return src


def test_builds_caches_and_reuses(cache, tmp_path):
    src = _source(tmp_path, 42)
    mod = cpp_build.load_extension("nl_cpp_build_probe", [src])
    assert mod.answer() == 42
    builds = [p for p in cache.iterdir() if p.is_dir()]
    assert len(builds) == 1 and (builds[0] / "nl_cpp_build_probe.so").exists()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary build left behind
    # Another process imports the cached build without compiling (no compiler on its PATH).
    code = (f"import sys; sys.path.insert(0, {os.fspath(os.path.dirname(cpp_build.__file__) + '/..')!r}); "
            "from nativelab import cpp_build; "
            f"print(cpp_build.load_extension('nl_cpp_build_probe', [{os.fspath(src)!r}]).answer())")
    env = dict(os.environ, CXX="/nonexistent/c++", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "42"


def test_changed_source_is_a_new_build(cache, tmp_path):
    k1 = cpp_build.build_key("nl_cpp_build_probe", [_source(tmp_path, 1)])
    k2 = cpp_build.build_key("nl_cpp_build_probe", [_source(tmp_path, 2)])
    k3 = cpp_build.build_key("nl_cpp_build_probe", [_source(tmp_path, 2)], extra_cflags=["-O3"])
    assert len({k1, k2, k3}) == 3


def test_no_compiler_is_one_clear_line(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(cpp_build.CppBuildError, match="no C\\+\\+ compiler '/nonexistent/c\\+\\+'") as e:
        cpp_build.load_extension("nl_cpp_build_probe", [_source(tmp_path, 7)])
    assert "\n" not in str(e.value)


def test_compile_error_names_the_extension(cache, tmp_path):
    src = tmp_path / "broken.cpp"
    src.write_text("this is not C++;\n")
    with pytest.raises(cpp_build.CppBuildError, match="building the C\\+\\+ extension 'nl_broken' failed"):
        cpp_build.load_extension("nl_broken", [src])
    assert not [p for p in cache.iterdir() if p.is_dir()]  # nothing half-built is kept
