"""The deployment files agree with each other and with the image: what a typo would break
without any test of ours noticing (a Kubernetes cluster and the MPIJob schema are not here)."""
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()
SSHD_PORT = re.search(r"HVDCLS_SSH_PORT=(\d+)", DOCKERFILE).group(1)
UID = int(re.search(r"ARG HVDCLS_UID=(\d+)", DOCKERFILE).group(1))


def mpijob() -> dict:
    docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "mpijob.yaml").read_text()))
    return next(d for d in docs if d["kind"] == "MPIJob")


def compose() -> dict:
    return yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())


def pod(role: str) -> dict:
    return mpijob()["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]


def test_mpijob_asks_for_as_many_ranks_as_it_has_slots():
    spec, args = mpijob()["spec"], pod("Launcher")["containers"][0]["args"]
    np = int(args[args.index("-np") + 1])
    assert np == spec["slotsPerWorker"] * spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert mpijob()["apiVersion"] == "kubeflow.org/v2beta1"


def test_mpijob_reaches_the_images_sshd_as_its_user():
    launcher_env = {e["name"]: e["value"] for e in pod("Launcher")["containers"][0]["env"]}
    assert f"-p {SSHD_PORT}" in launcher_env["OMPI_MCA_plm_rsh_args"]
    worker = pod("Worker")["containers"][0]
    assert worker["args"] == ["worker"]
    assert worker["ports"][0]["containerPort"] == int(SSHD_PORT)
    assert worker["readinessProbe"]["tcpSocket"]["port"] == int(SSHD_PORT)
    assert mpijob()["spec"]["sshAuthMountPath"] == "/home/hvd/.ssh"
    for role in ("Launcher", "Worker"):
        assert pod(role)["securityContext"]["runAsUser"] == UID


def test_mpijob_volumes_are_declared():
    claims = {d["metadata"]["name"] for d in yaml.safe_load_all(
        (REPO / "deploy" / "kubernetes" / "mpijob.yaml").read_text()) if d["kind"] == "PersistentVolumeClaim"}
    for role in ("Launcher", "Worker"):
        spec = pod(role)
        declared = {v["name"]: v for v in spec["volumes"]}
        for mount in spec["containers"][0]["volumeMounts"]:
            assert declared[mount["name"]]["persistentVolumeClaim"]["claimName"] in claims


def test_compose_workers_serve_ssh_on_the_images_port_on_a_private_network():
    services = compose()["services"]
    workers = [name for name, s in services.items() if s.get("command") == "worker"]
    assert len(workers) >= 2
    for name in workers:
        assert services[name]["hostname"] == name
        assert services[name]["environment"]["HVDCLS_SSH_PORT"] == SSHD_PORT
        assert f"/{SSHD_PORT}" in " ".join(services[name]["healthcheck"]["test"])
    assert services["launcher"]["environment"]["HVDCLS_WORKERS"] == ",".join(workers)
    assert compose()["networks"]["cluster"]["internal"] is True


def test_compose_keeps_the_ssh_key_in_a_volume_made_at_start_up():
    services = compose()["services"]
    assert services["keygen"]["command"] == "keygen"
    for name, service in services.items():
        if name == "prometheus":  # not the hvdcls image: no SSH, no shared volume
            assert "volumes" not in service
            continue
        assert "ssh:/home/hvd/.ssh" in service["volumes"], name
        if service.get("command") == "worker":
            assert service["depends_on"]["keygen"]["condition"] == "service_completed_successfully"
    assert "id_ed25519" not in DOCKERFILE and "ssh-keygen" not in DOCKERFILE


def test_the_slurm_cluster_matches_its_slurm_conf_and_keeps_its_keys_in_volumes():
    cluster = yaml.safe_load((REPO / "docker" / "slurm.yaml").read_text())
    services, conf = cluster["services"], (REPO / "docker" / "slurm" / "slurm.conf").read_text()
    nodes = [name for name, s in services.items() if s.get("command") == "node"]
    assert nodes == ["node1", "node2"] and "NodeName=node[1-2] " in conf and "Nodes=node[1-2] " in conf
    assert services["slurmctld"]["hostname"] == "slurmctld" and "SlurmctldHost=slurmctld\n" in conf
    assert (services["munge-key"]["command"], services["keygen"]["command"]) == ("munge-key", "keygen")
    for name in ("slurmctld", *nodes, "service"):
        assert {"munge:/etc/munge", "ssh:/home/hvd/.ssh", "shared:/shared"} <= set(services[name]["volumes"]), name
    for name in ("slurmctld", *nodes):
        assert services[name]["depends_on"]["munge-key"]["condition"] == "service_completed_successfully"
    for name in nodes:
        assert services[name]["hostname"] == name
        assert services[name]["environment"]["HVDCLS_SSH_PORT"] == SSHD_PORT
        assert services["service"]["depends_on"][name]["condition"] == "service_healthy"
    assert cluster["networks"]["cluster"]["internal"] is True
    # The key is made per project; the package's own is deleted in the image's only apt layer.
    assert "/etc/munge/munge.key" in (REPO / "docker" / "slurm" / "Dockerfile").read_text()


def test_the_compose_service_serves_the_workers_where_its_prometheus_scrapes():
    services = compose()["services"]
    workers = [name for name, s in services.items() if s.get("command") == "worker"]
    command = services["service"]["command"]
    # --job-metrics: what the scrape config's `hvdcls` job discovers; --open-metrics: its Prometheus has no token
    switches = {"--job-metrics", "--open-metrics"}
    assert switches <= set(command)
    rest = [word for word in command[1:] if word not in switches]
    flags = dict(zip(rest[::2], rest[1::2]))
    assert command[0] == "service" and flags["--hosts"] == ",".join(f"{w}:2" for w in workers)
    assert flags["--bind"] == "0.0.0.0"  # the other containers reach it; the network is private
    assert services["launcher"]["environment"]["HVDCLS_SERVE_URL"] == f"http://service:{flags['--port']}"
    scrape = yaml.safe_load((REPO / "docker" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert sorted(jobs) == ["hvdcls", "hvdcls-serve"]
    assert jobs["hvdcls-serve"]["static_configs"][0]["targets"] == [f"service:{flags['--port']}"]
    assert jobs["hvdcls"]["http_sd_configs"][0]["url"] == f"http://service:{flags['--port']}/targets"
    assert "prometheus.yml" in (REPO / "docker" / "prometheus" / "Dockerfile").read_text()
