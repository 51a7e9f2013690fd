"""hvdcls-horovodrun's cached answer to "built with Gloo / MPI?" (the launch itself is every
parallel test's: launch.horovodrun names this launcher)."""
import os

from hvdcls.launching import horovodrun, launch


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


def test_failed_status_is_the_first_failed_ranks():
    gloo = ("Horovod detected that one or more processes exited with non-zero status, thus causing the "
            "job to be terminated. The first process to do so was: Process name: 1 Exit code: 75")
    assert horovodrun.failed_status(gloo) == 75
    assert horovodrun.failed_status("mpirun failed with exit code 2") == 2
    assert horovodrun.failed_status("Process name: 0 Exit code: -9") == 137  # killed by SIGKILL
    assert horovodrun.failed_status("could not connect to some hosts via ssh") == 1
    assert horovodrun.failed_status("Exit code: 300") == 1
    assert "out-of-memory killer" in horovodrun.cause(137)  # what a SIGKILLed rank most often is
    assert horovodrun.cause(2) == horovodrun.cause(143) == ""


def test_a_failed_rank_is_one_line_and_its_status():
    """A real launch whose rank exits 2 (as a user error does): Horovod's launcher raises, and
    hvdcls-horovodrun says so in one line and exits 2, not 1 with the launcher's traceback."""
    import subprocess

    tool = launch.horovodrun_tool()
    assert tool.endswith("hvdcls-horovodrun")
    result = subprocess.run([tool, "-np", "1", "-H", "localhost:1", "--gloo", "sh", "-c", "exit 2"],
                            capture_output=True, text=True, timeout=120, env=launch.single_host_env())
    mine = [line for line in result.stderr.splitlines() if line.startswith("hvdcls-horovodrun:")]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(mine) == 1 and "Exit code: 2" in mine[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr
