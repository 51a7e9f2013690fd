"""hvdcls-horovodrun's cached answer to "built with Gloo / MPI?" (the launch itself is every
parallel test's: launch.horovodrun names this launcher)."""
import os

from hvdcls import horovodrun, launch


def fake_horovod(tmp_path):
    package = tmp_path / "horovod"
    for binding, name in (("torch", "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"),
                          ("tensorflow", "mpi_lib.cpython-311-x86_64-linux-gnu.so")):
        (package / binding).mkdir(parents=True)
        (package / binding / name).write_bytes(b"\0" * 8)
    return package


def test_the_key_moves_when_a_binding_is_rebuilt(tmp_path):
    libraries = horovodrun.extension_libraries(fake_horovod(tmp_path))
    assert [path.parent.name for path in libraries] == ["tensorflow", "torch"]
    before = horovodrun.build_key(libraries)
    assert horovodrun.build_key(libraries) == before
    os.utime(libraries[1], ns=(1, 1))
    assert horovodrun.build_key(libraries) != before


def test_probed_once_then_read_from_the_cache(tmp_path, monkeypatch):
    package = fake_horovod(tmp_path)
    monkeypatch.delenv("HVDCLS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(horovodrun, "horovod_dir", lambda: package)
    asked = []
    monkeypatch.setattr(horovodrun, "probe", lambda found: asked.append(found) or {"gloo": True, "mpi": False})
    libraries = horovodrun.extension_libraries(package)
    assert horovodrun.controllers_built() == {"gloo": True, "mpi": False}
    assert horovodrun.controllers_built() == {"gloo": True, "mpi": False}
    assert asked == [libraries]
    written = list((tmp_path / "cache" / "hvdcls").iterdir())
    assert len(written) == 1 and not written[0].name.startswith(".")  # no temporary left
    written[0].write_text("{torn")  # a damaged cache is asked again, not trusted
    assert horovodrun.controllers_built() == {"gloo": True, "mpi": False} and len(asked) == 2


def test_no_answer_without_a_binding(tmp_path, monkeypatch):
    monkeypatch.setattr(horovodrun, "horovod_dir", lambda: tmp_path)
    assert horovodrun.controllers_built() is None


def test_the_real_probe_answers_for_the_installed_horovod():
    package = horovodrun.horovod_dir()
    assert package is not None
    assert horovodrun.probe(horovodrun.extension_libraries(package)) == {"gloo": True, "mpi": True}


def test_launch_names_our_launcher_where_it_is_installed():
    assert launch.horovodrun(2, ["x"])[0].endswith("hvdcls-horovodrun")
