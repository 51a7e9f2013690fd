"""deploy/systemd/hvdcls-serve.service: the settings the jobs' survival rests on, and a command
line `hvdcls serve` accepts. (It is not run under a real systemd here: no systemd is PID 1 in
the test machine; `systemd-analyze verify` finds nothing but the example venv path.)"""
import configparser
import shlex
from pathlib import Path

from hvdcls.cli import build_parser

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "hvdcls-serve.service"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_stopping_or_restarting_the_unit_leaves_the_jobs_running():
    service = unit()["Service"]
    assert service["KillMode"] == "process"  # only the service's own process is signalled
    assert service["Restart"] == "always"  # a crash is followed by a start, which adopts the jobs
    assert "PrivateTmp" not in service  # removed at stop, under the jobs that run on


def test_its_command_line_is_one_hvdcls_serve_accepts():
    program, *argv = shlex.split(unit()["Service"]["ExecStart"])
    assert program.endswith("/bin/hvdcls") and argv[0] == "serve"
    args = build_parser().parse_args(argv)
    given = (str(args.hosts_file), str(args.state_dir), args.port)
    assert given == ("/etc/hvdcls/hosts", "/var/lib/hvdcls/serve", 8470)
