"""Caches other users cannot write (src/nativelab/private_dir.py): native code, compiled graphs and tuning
results are loaded only from a directory, and an entry, that this user owns and that neither group nor others
can write; another is refused in one warning naming it, and the program goes on with a private directory.

Each cache is pointed at a directory holding a planted entry, one another user could have written: loading
it would run their code or use their graph. As root, "another user" is uid 65534 (nobody)."""

import os
import stat
import subprocess
import sysconfig
import textwrap
from pathlib import Path

import pytest

from nativelab import cpp_build, settings
from nativelab.compiler import cache as graph_cache
from nativelab.kernels.cpu import tune

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _make_unsafe(path: Path, how: str) -> None:
    if how == "0777":
        os.chmod(path, 0o777)
    elif how == "0666":
        os.chmod(path, 0o666)
    else:
        if os.getuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(path, NOBODY, NOBODY)


@pytest.fixture
def own_cache_home(tmp_path, monkeypatch):
    """The user's own cache (the settings' defaults live under it): where a refused cache's entries go."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    return tmp_path / "home-cache" / "nativelab"


def _one_refusal(record, path: Path) -> str:
    msgs = [str(w.message) for w in record if "not loading" in str(w.message)]
    assert len(msgs) == 1, msgs
    assert f"from {path} (" in msgs[0] and "\n" not in msgs[0], msgs[0]
    return msgs[0]


# -- native code ------------------------------------------------------------------------------------------------

SRC = textwrap.dedent("""
    #include <Python.h>
    static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", nullptr, -1, methods};
    PyMODINIT_FUNC PyInit_NAME() { return PyModule_Create(&def); }
""")


def _source(path: Path, name: str, answer: int) -> Path:
    path.write_text(SRC.replace("NAME", name).replace("ANSWER", str(answer)))
    return path


def _plant_extension(root: Path, name: str, source: Path) -> Path:
    """Another user's build of `name`, answering 666, where the cache looks for the build of `source`."""
    key = cpp_build.build_key(name, [str(source)])
    so = root / f"{name}-{key}" / f"{name}.so"
    so.parent.mkdir(parents=True)
    forged = _source(root / "forged.cpp", name, 666)
    subprocess.run([cpp_build.compiler(), "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                    str(forged), "-o", str(so)], check=True, timeout=120)
    forged.unlink()
    return so


@pytest.mark.parametrize("how", ["0777", "nobody"])
def test_native_code_is_not_loaded_from_a_directory_another_user_can_write(tmp_path, own_cache_home, how):
    name = f"nl_cache_probe_{how}"
    source = _source(tmp_path / "probe.cpp", name, 42)
    shared = tmp_path / "shared"
    shared.mkdir()
    _plant_extension(shared, name, source)
    before = sorted(shared.rglob("*"))
    _make_unsafe(shared, how)
    with settings.CPP_CACHE_DIR.set(shared), pytest.warns(UserWarning) as record:
        mod = cpp_build.load_extension(name, [source])
    assert mod.answer() == 42  # built here, not the planted 666
    _one_refusal(record, shared)
    assert sorted(shared.rglob("*")) == before  # nothing built into it either
    private = own_cache_home / "cpp"
    assert Path(mod.__file__).parent.parent == private and _mode(private) == 0o700
    assert _mode(Path(mod.__file__).parent) == 0o700


def test_native_code_cache_directories_are_made_0700_and_loaded_from_as_before(tmp_path, own_cache_home, recwarn):
    own = tmp_path / "made" / "cpp"  # neither exists yet
    with settings.CPP_CACHE_DIR.set(own):
        built = cpp_build.load_extension("nl_cache_probe_new", [_source(tmp_path / "new.cpp", "nl_cache_probe_new", 7)])
        assert built.answer() == 7
        assert _mode(tmp_path / "made") == _mode(own) == _mode(Path(built.__file__).parent) == 0o700
        name = "nl_cache_probe_own"
        source = _source(tmp_path / "probe.cpp", name, 42)
        so = _plant_extension(own, name, source)
        mod = cpp_build.load_extension(name, [source])
    assert mod.answer() == 666 and mod.__file__ == str(so)  # the cache's own build, trusted as before
    assert not [w for w in recwarn if "not loading" in str(w.message)]


# -- compiled graphs --------------------------------------------------------------------------------------------

KEY = "ab" + "0" * 62
PAYLOAD = b"a compiled graph"


def _plant_graph(root: Path) -> Path:
    root.mkdir(mode=0o700, exist_ok=True)
    with settings.CACHE_DIR.set(root):
        return graph_cache.write(KEY, PAYLOAD)  # a whole entry, checksum and all


@pytest.mark.parametrize("where, how", [("root", "0777"), ("root", "nobody"), ("entry dir", "nobody"),
                                        ("entry dir", "0777"), ("entry", "0666"), ("entry", "nobody")])
def test_graphs_are_not_loaded_from_a_directory_or_entry_another_user_can_write(tmp_path, own_cache_home,
                                                                                where, how):
    shared = tmp_path / "shared"
    entry = _plant_graph(shared)
    unsafe = {"root": shared, "entry dir": entry.parent, "entry": entry}[where]
    _make_unsafe(unsafe, how)
    with settings.CACHE_DIR.set(shared):
        with pytest.warns(UserWarning) as record:
            assert graph_cache.read(KEY) is None
        message = _one_refusal(record, unsafe)
        assert str(own_cache_home / "neff") in message
        written = graph_cache.write(KEY, b"compiled again")  # the program goes on, in its private directory
        assert graph_cache.read(KEY) == b"compiled again"
    assert written.is_relative_to(own_cache_home / "neff")
    assert _mode(own_cache_home / "neff") == _mode(written.parent) == 0o700
    assert entry.read_bytes().endswith(PAYLOAD)  # the shared entry is left as it was


def test_graphs_in_an_own_private_directory_are_loaded_and_new_directories_are_0700(tmp_path, recwarn):
    root = tmp_path / "made" / "neff"  # neither exists yet
    with settings.CACHE_DIR.set(root):
        path = graph_cache.write(KEY, PAYLOAD)
        assert graph_cache.read(KEY) == PAYLOAD
    assert path.is_relative_to(root)
    assert _mode(tmp_path / "made") == _mode(root) == _mode(path.parent) == 0o700
    assert not [w for w in recwarn if "not loading" in str(w.message)]


# -- tuning results ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["0777", "nobody"])
def test_tuning_results_are_not_loaded_from_a_directory_another_user_can_write(tmp_path, own_cache_home, how):
    key = tune.cache_key("probe", 1, "bfloat16", (2, 3))
    planted = tune.DecodeConfig(rows=8)
    shared = tmp_path / "shared"
    with settings.TUNE_CACHE_DIR.set(shared):
        tune.store(key, planted, {}, 0.1)
        assert tune.cached(key) == planted  # the entry is a good one, in a private directory
        _make_unsafe(shared, how)
        with pytest.warns(UserWarning) as record:
            assert tune.cached(key) is None
        _one_refusal(record, shared)
        path = tune.store(key, tune.DecodeConfig(), {}, 0.1)
        assert tune.cached(key) == tune.DecodeConfig()
    assert path.is_relative_to(own_cache_home / "tune") and _mode(own_cache_home / "tune") == 0o700


def test_new_tuning_directories_are_0700(tmp_path):
    root = tmp_path / "tune"
    with settings.TUNE_CACHE_DIR.set(root):
        tune.store(tune.cache_key("probe", 1, "bfloat16", (2, 3)), tune.DecodeConfig(), {}, 0.1)
    assert _mode(root) == 0o700


def test_a_cache_that_cannot_be_created_falls_back_to_a_private_temporary_directory(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # the default cannot be made either
    with settings.CACHE_DIR.set(blocked / "neff"), pytest.warns(UserWarning, match="cannot be created"):
        path = graph_cache.write(KEY, PAYLOAD)
    assert not path.is_relative_to(tmp_path) and _mode(path.parent.parent) == 0o700
