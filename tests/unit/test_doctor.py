"""`hvdcls doctor`'s reading of Horovod's report and its diagnoses (no subprocess needed)."""
from hvdcls.checks import doctor

CHECK_BUILD = """
Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [{nccl}] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""
VERSIONS = {"python": "3.11.7", "torch": "2.14.1", "torchvision": "0.29.1",
            "tensorflow": "2.18.1", "keras": "3.15.1", "horovod": "0.28.1",
            "mpi4py": "4.1.2", "mpi": "mpirun (Open MPI) 4.1.4"}


def parsed(nccl: str = " ") -> dict:
    return doctor.parse_check_build(CHECK_BUILD.format(nccl=nccl))


def test_parse_check_build_reads_every_section():
    result = parsed()
    assert result["frameworks"] == {"TensorFlow": True, "PyTorch": True, "MXNet": False}
    assert result["controllers"] == {"MPI": True, "Gloo": True}
    assert result["tensor_operations"]["Gloo"] and not result["tensor_operations"]["NCCL"]


def test_build_variant_names_cpu_and_gpu_builds():
    assert doctor.build_variant(parsed()) == "CPU (Gloo + MPI)"
    assert doctor.build_variant(parsed("X")).startswith("GPU (NCCL")


def test_complete_installation_has_no_problems():
    assert doctor.framework_problems(VERSIONS, parsed()) == []
    assert doctor.horovod_problems(VERSIONS, parsed()) == []


def test_extension_that_does_not_load_is_reported():
    check_build = parsed()
    check_build["frameworks"]["TensorFlow"] = False
    problems = doctor.framework_problems(VERSIONS, check_build)
    assert len(problems) == 1 and "TensorFlow extension does not load" in problems[0]


def test_missing_controller_is_reported_with_a_fix():
    check_build = parsed()
    check_build["controllers"]["MPI"] = False
    problems = doctor.horovod_problems(VERSIONS, check_build)
    assert problems and all("make setup" in p for p in problems)


def test_missing_horovod_says_how_to_build_it():
    problems = doctor.horovod_problems(dict(VERSIONS, horovod=""), {})
    assert problems == [p for p in problems if "make setup" in p] and len(problems) == 1


def test_wheel_built_for_another_torch_is_reported():
    problems = doctor.build_mismatch_problems({"torch": "2.13.0+cpu", "tensorflow": "2.18.1"},
                                              VERSIONS, parsed())
    assert len(problems) == 1 and "2.13.0" in problems[0] and "2.14.1" in problems[0]


def test_local_version_suffix_is_not_a_mismatch():
    built = {"torch": "2.14.1+cu130", "tensorflow": "2.18.1"}
    assert doctor.build_mismatch_problems(built, VERSIONS, parsed()) == []


def test_nccl_build_beside_tensorflow_cpu_is_reported(monkeypatch):
    monkeypatch.setattr(doctor, "dist_version", lambda *names: "2.18.1" if "tensorflow-cpu" in names else "")
    problems = doctor.build_mismatch_problems({}, VERSIONS, parsed("X"))
    assert len(problems) == 1 and "GPU=1" in problems[0]


def test_report_lists_problems_and_fails():
    report = doctor.Report(versions=VERSIONS, check_build=parsed(), problems=["x is missing: fix it"])
    text = doctor.render(report)
    assert "PROBLEM: x is missing" in text and not report.ok
