"""The Horovod build recipe: standard detection, the compiler launcher, the cache key."""
import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

import horovod_wheel as hw

LAUNCHER = str(hw.LAUNCHER)


def fake_torch(tmp_path: Path, header: str, version_py: str = "cuda = None\n") -> Path:
    torch_dir = tmp_path / "torch"
    (torch_dir / "include" / "ATen").mkdir(parents=True)
    (torch_dir / "include" / "ATen" / "ATen.h").write_text(header)
    (torch_dir / "version.py").write_text(version_py)
    return torch_dir


@pytest.mark.parametrize("header, expected", [
    ("#if !defined(__cplusplus) || __cplusplus < 202002L\n"
     "#error C++20 or later compatible compiler is required to use ATen.\n#endif\n", "20"),
    ("#error C++17 or later compatible compiler is required to use ATen.\n", "17"),
    ("// an older torch that states nothing\n", "17"),
])
def test_required_cxx_standard_follows_torch_headers(tmp_path, header, expected):
    assert hw.required_cxx_standard(fake_torch(tmp_path, header)) == expected


def test_torch_cuda_version_read_without_import(tmp_path):
    torch_dir = fake_torch(tmp_path, "", "__version__ = '2.14.1'\ncuda: Optional[str] = '13.0'\n")
    assert hw.torch_cuda_version(torch_dir) == "13.0"
    assert hw.torch_cuda_version(fake_torch(tmp_path / "cpu", "", "cuda = None\n")) == ""


def launch(*args: str, std: str = "20") -> list[str]:
    """Run the launcher with `echo` as the compiler: it prints the command it would run."""
    out = subprocess.run(["sh", LAUNCHER, "echo", *args], capture_output=True, text=True,
                         check=True, env={"HVDCLS_CXX_STD": std, "PATH": "/usr/bin:/bin"})
    return out.stdout.split()


AVX = "-DGLOO_USE_AVX=1"  # every compile: gloo/math.h declares Gloo's F16C float16 sums


def test_launcher_lifts_only_cxx14():
    assert launch("-O3", "-std=gnu++14", "-c", "a.cc") == [AVX, "-O3", "-std=gnu++20", "-c", "a.cc"]
    assert launch("-std=c++14", "x y.cc") == [AVX, "-std=c++20", "x", "y.cc"]
    assert launch("-std=gnu++17", "-c", "tf.cc") == [AVX, "-std=gnu++17", "-c", "tf.cc"]
    assert launch("-std=gnu++14", std="17") == [AVX, "-std=gnu++17"]


def test_launcher_compiles_gloo_math_into_types_cc():
    """Gloo's CMake never compiles math.cc (the F16C sums): each Gloo library's types.cc takes it."""
    for lib in ("gloo", "compatible_gloo", "compatible17_gloo"):
        source = f"/b/third_party/{lib}/gloo/types.cc"
        assert launch("-std=gnu++17", "-c", source) == [
            AVX, "-include", f"/b/third_party/{lib}/gloo/math.cc", "-std=gnu++17", "-c", source]
    assert "-include" not in launch("-c", "/b/third_party/gloo/gloo/allreduce.cc")
    assert "-include" not in launch("-c", "/b/horovod/common/ops/gloo_operations.cc")


def test_launcher_refuses_to_guess_the_standard():
    result = subprocess.run(["sh", LAUNCHER, "echo", "-std=gnu++14"], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode != 0 and "HVDCLS_CXX_STD" in result.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_launcher_really_compiles_cxx20_code_asked_as_cxx14(tmp_path):
    """What Horovod's torch target asks for (-std=gnu++14) must reach g++ as C++20."""
    source = tmp_path / "needs20.cc"
    source.write_text("#if __cplusplus < 202002L\n#error not C++20\n#endif\n"
                      "#include <span>\nint main() { int a[2] = {1, 2}; return std::span(a).size() - 2; }\n")
    cmd = ["sh", LAUNCHER, "g++", "-std=gnu++14", str(source), "-o", str(tmp_path / "a.out")]
    plain = subprocess.run(cmd[2:], capture_output=True, text=True)
    assert plain.returncode != 0  # without the launcher it cannot build
    subprocess.run(cmd, check=True, env={"HVDCLS_CXX_STD": "20", "PATH": "/usr/bin:/bin"})
    assert subprocess.run([str(tmp_path / "a.out")]).returncode == 0


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None, reason="needs g++ and nm")
def test_launcher_really_defines_the_avx_sums_in_types_object(tmp_path):
    """What Gloo's CMake compiles (types.cc) must come out holding math.cc's GLOO_USE_AVX code."""
    gloo = tmp_path / "third_party" / "gloo" / "gloo"
    gloo.mkdir(parents=True)
    (gloo / "types.cc").write_text("int gloo_types_marker() { return 1; }\n")
    (gloo / "math.cc").write_text("#if GLOO_USE_AVX\nint gloo_f16c_sum() { return 2; }\n#endif\n")
    obj = tmp_path / "types.o"
    subprocess.run(["sh", LAUNCHER, "g++", "-c", str(gloo / "types.cc"), "-o", str(obj)], check=True,
                   env={"HVDCLS_CXX_STD": "20", "PATH": "/usr/bin:/bin"})
    symbols = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    assert "gloo_types_marker()" in symbols and "gloo_f16c_sum()" in symbols


def inputs(**changes) -> hw.BuildInputs:
    base = hw.BuildInputs(horovod="0.28.1", python="cp311", platform="linux_x86_64",
                          torch="2.14.1", tensorflow="2.18.1", cxx_std="20",
                          mpi="mpirun (Open MPI) 4.1.4", cuda_home="/usr/local/cuda",
                          gpu_operations="", nccl="", recipe="abc")
    return dataclasses.replace(base, **changes)


def test_cache_key_is_stable_and_readable():
    key = inputs().key()
    assert key == inputs().key()
    assert key.startswith("horovod-0.28.1-cp311-linux_x86_64-torch2.14.1-tf2.18.1-cpu-")


@pytest.mark.parametrize("change", [
    {"torch": "2.13.0"}, {"tensorflow": "2.17.1"}, {"python": "cp312"}, {"cxx_std": "17"},
    {"mpi": "mpirun (Open MPI) 5.0.3"}, {"cuda_home": ""}, {"gpu_operations": "NCCL"},
    {"nccl": "nvidia-nccl==2.30.7"},
    {"recipe": "def"}, {"horovod": "0.28.0"},
])
def test_cache_key_changes_with_every_build_input(change):
    assert inputs(**change).key() != inputs().key()


def test_gpu_build_is_named_as_such():
    assert "-nccl-" in inputs(gpu_operations="NCCL").key()


def test_build_environment_lifts_standard_and_finds_cuda(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("HOROVOD_CUDA_HOME", raising=False)
    env = hw.build_environment(inputs(), tmp_path)
    assert env["CMAKE_CXX_COMPILER_LAUNCHER"] == LAUNCHER and env["HVDCLS_CXX_STD"] == "20"
    assert env["CUDA_HOME"] == env["HOROVOD_CUDA_HOME"] == "/usr/local/cuda"
    for flag in ("HOROVOD_WITH_PYTORCH", "HOROVOD_WITH_TENSORFLOW", "HOROVOD_WITH_GLOO",
                 "HOROVOD_WITH_MPI", "HOROVOD_WITHOUT_MXNET"):
        assert env[flag] == "1"
    assert "HOROVOD_GPU_OPERATIONS" not in env  # the CPU build leaves NCCL off


def test_build_ignores_horovod_variables_left_in_the_shell(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_WITHOUT_PYTORCH", "1")
    monkeypatch.setenv("HOROVOD_GPU_OPERATIONS", "NCCL")
    env = hw.build_environment(inputs(), tmp_path)
    assert "HOROVOD_WITHOUT_PYTORCH" not in env and "HOROVOD_GPU_OPERATIONS" not in env
    assert "HOROVOD_CUDA_HOME" not in hw.build_environment(inputs(cuda_home=""), tmp_path)


def test_cached_wheel_is_reused_without_building(tmp_path, monkeypatch):
    target = tmp_path / "wheels" / inputs().key()
    target.mkdir(parents=True)
    wheel = target / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"")
    monkeypatch.setattr(hw, "build_wheel", lambda *a: pytest.fail("must not rebuild"))
    assert hw.cached_wheel(tmp_path, inputs(), rebuild=False) == wheel


def test_rebuild_and_stale_entries_build_again(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(hw, "build_wheel", lambda cache, inp, target: built.append(target) or target)
    target = tmp_path / "wheels" / inputs().key()
    target.mkdir(parents=True)
    (target / "build-info.json").write_text("{}")  # an entry that lost its wheel
    hw.cached_wheel(tmp_path, inputs(), rebuild=False)
    target.mkdir(exist_ok=True)
    (target / "horovod-0.28.1-x.whl").write_bytes(b"")  # a good entry, but --rebuild asked
    hw.cached_wheel(tmp_path, inputs(), rebuild=True)
    assert built == [target, target]


def test_interrupted_build_leaves_no_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(hw, "fetch_sdist", lambda cache: tmp_path / "horovod-0.28.1.tar.gz")

    def failing_build(cmd, log, env):
        raise hw.SetupError("compiler died")

    monkeypatch.setattr(hw, "run_logged", failing_build)
    with pytest.raises(hw.SetupError):
        hw.cached_wheel(tmp_path, inputs(), rebuild=False)
    assert not (tmp_path / "wheels" / inputs().key()).exists()
    assert not list(tmp_path.glob(".build-*"))


def fake_toolkit(root: Path) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    return root


def test_cuda_home_skips_an_nvcc_wrapper_without_headers(tmp_path, monkeypatch):
    """/usr/local/bin/nvcc as a wrapper script must not make /usr/local the toolkit."""
    toolkit = fake_toolkit(tmp_path / "cuda-13.0")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert hw.cuda_toolkit_home() == str(toolkit)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "not-a-toolkit"))
    assert hw.cuda_toolkit_home() != str(tmp_path / "not-a-toolkit")


def test_gpu_build_gets_an_nccl_prefix_cmake_can_find(tmp_path, monkeypatch):
    """torch's nvidia-nccl wheel has only libnccl.so.2; CMake looks for libnccl.so."""
    monkeypatch.delenv("HOROVOD_NCCL_HOME", raising=False)
    nccl = tmp_path / "site" / "nvidia" / "nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "include" / "nccl.h").write_text("")
    (nccl / "lib").mkdir()
    (nccl / "lib" / "libnccl.so.2").write_text("")
    monkeypatch.setattr(hw, "package_dir", lambda name: tmp_path / "site" / name)
    monkeypatch.setattr(hw, "distribution_version",
                        lambda name: "2.30.7" if name == "nvidia-nccl-cu13" else "")
    env = hw.build_environment(inputs(gpu_operations="NCCL", nccl=hw.nccl_source()), tmp_path / "cache")
    home = Path(env["HOROVOD_NCCL_HOME"])
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_NCCL_LINK"] == "SHARED"
    assert (home / "include" / "nccl.h").exists()
    assert (home / "lib" / "libnccl.so").resolve() == (nccl / "lib" / "libnccl.so.2").resolve()
    assert home.is_relative_to(tmp_path / "cache")  # nothing written into site-packages
    # A second venv (another clone) re-points the links instead of failing on the old ones.
    moved = tmp_path / "site2" / "nvidia"
    shutil.copytree(tmp_path / "site" / "nvidia", moved)
    shutil.rmtree(tmp_path / "site")
    monkeypatch.setattr(hw, "package_dir", lambda name: tmp_path / "site2" / name)
    home = Path(hw.build_environment(inputs(gpu_operations="NCCL", nccl=hw.nccl_source()),
                                     tmp_path / "cache")["HOROVOD_NCCL_HOME"])
    assert (home / "include" / "nccl.h").exists()


def test_users_own_nccl_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_NCCL_HOME", str(tmp_path / "nccl-2.21"))
    assert hw.nccl_source() == str(tmp_path / "nccl-2.21")
    env = hw.build_environment(inputs(gpu_operations="NCCL", nccl=hw.nccl_source()), tmp_path)
    assert env["HOROVOD_NCCL_HOME"] == str(tmp_path / "nccl-2.21")


def test_new_key_fields_left_empty_keep_the_old_cache_key():
    """Wheels cached before --torch-only/--cuda-cc-list existed are still found."""
    import hashlib
    import json
    old_fields = {name: value for name, value in dataclasses.asdict(inputs()).items()
                  if name not in hw.OPTIONAL_KEY_FIELDS}
    digest = hashlib.sha256(json.dumps(old_fields, sort_keys=True).encode()).hexdigest()[:12]
    assert inputs().key().endswith(f"-cpu-{digest}")
    assert hw.recipe_digest() == hw.recipe_digest(hw.FIXED_FLAGS)


def test_torch_only_build_has_its_own_key_and_flags(tmp_path):
    torch_only = inputs(frameworks="torch", tensorflow="", mpi="")
    assert "-torchonly-" in torch_only.key() and torch_only.key() != inputs().key()
    assert inputs(cuda_cc_list="90").key() != inputs().key()
    assert hw.recipe_digest(hw.TORCH_ONLY_FLAGS) != hw.recipe_digest()
    env = hw.build_environment(torch_only, tmp_path)
    assert env["HOROVOD_WITHOUT_TENSORFLOW"] == env["HOROVOD_WITHOUT_MPI"] == "1"
    assert env["HOROVOD_WITH_PYTORCH"] == env["HOROVOD_WITH_GLOO"] == "1"
    assert "HOROVOD_WITH_TENSORFLOW" not in env and "HOROVOD_WITH_MPI" not in env
    assert "HOROVOD_BUILD_CUDA_CC_LIST" not in env
    assert hw.build_environment(inputs(cuda_cc_list="90"), tmp_path)["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"


def test_torch_only_needs_neither_tensorflow_nor_mpirun(tmp_path, monkeypatch):
    torch_dir = fake_torch(tmp_path, "")
    monkeypatch.setattr(hw, "package_dir", lambda name: torch_dir if name == "torch" else None)
    monkeypatch.setattr(hw, "distribution_version", lambda name: "2.11.0" if name == "torch" else "")
    monkeypatch.setattr(hw, "command_first_line", lambda *cmd: pytest.fail("must not ask for mpirun"))
    got = hw.collect_inputs(gpu=False, torch_only=True, cuda_cc_list="90")
    assert (got.frameworks, got.tensorflow, got.mpi, got.cuda_cc_list) == ("torch", "", "", "90")
    with pytest.raises(hw.SetupError, match="--torch-only"):
        hw.collect_inputs(gpu=False)


def test_carried_sdist_is_built_without_download(tmp_path, monkeypatch):
    sdist = tmp_path / "carried" / "horovod-0.28.1.tar.gz"
    sdist.parent.mkdir()
    sdist.write_bytes(b"")
    monkeypatch.setattr(hw, "run_logged", lambda *a: pytest.fail("must not download"))
    monkeypatch.setattr(hw, "SDIST_OVERRIDE", sdist)
    assert hw.fetch_sdist(tmp_path / "cache") == sdist
    monkeypatch.setattr(hw, "SDIST_OVERRIDE", tmp_path / "missing.tar.gz")
    with pytest.raises(hw.SetupError, match="no such file"):
        hw.fetch_sdist(tmp_path / "cache")


def test_main_options_reach_the_build(tmp_path, monkeypatch, capsys):
    seen = {}

    def collect(gpu, torch_only=False, cuda_cc_list=""):
        seen.update(gpu=gpu, torch_only=torch_only, cc=cuda_cc_list,
                    nccl=hw.os.environ.get("HOROVOD_NCCL_HOME"), sdist=hw.SDIST_OVERRIDE)
        return inputs(frameworks="torch" if torch_only else "", cuda_cc_list=cuda_cc_list)

    monkeypatch.setattr(hw, "collect_inputs", collect)
    monkeypatch.setattr(hw, "SDIST_OVERRIDE", None)
    monkeypatch.delenv("HOROVOD_NCCL_HOME", raising=False)
    monkeypatch.setattr(hw.os, "environ", dict(hw.os.environ))  # main() may set HOROVOD_NCCL_HOME
    assert hw.main(["--gpu", "--torch-only", "--sdist", str(tmp_path / "h.tar.gz"), "--nccl-home",
                    str(tmp_path / "nccl"), "--cuda-cc-list", "90", "--print-key"]) == 0
    assert seen == {"gpu": True, "torch_only": True, "cc": "90", "nccl": str(tmp_path / "nccl"),
                    "sdist": tmp_path / "h.tar.gz"}
    assert "-torchonly-" in capsys.readouterr().out
    assert hw.main(["--cuda-cc-list", "sm_90", "--print-key"]) == 2
    assert "--cuda-cc-list" in capsys.readouterr().err
