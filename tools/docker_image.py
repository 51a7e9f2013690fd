"""`make wheelhouse` and `make image`: hvdcls's Docker images, built offline from a wheelhouse.

    .venv/bin/python tools/docker_image.py wheelhouse [--gpu]
    .venv/bin/python tools/docker_image.py image [--gpu] [--base-image B] [--tag T] [--rebuild]
    .venv/bin/python tools/docker_image.py slurm-image [--app-image A] [--tag T] [--rebuild]
    .venv/bin/python tools/docker_image.py prometheus-image [--base-image B] [--tag T] [--rebuild]

The build context is build/docker/ (never the repository root):
    wheelhouse/   every wheel the image installs, and requirements.txt naming the pins
    app/          the hvdcls wheel made from this tree and the wheels of its `serve` extra
                  (`hvdcls serve` and its client: small, so they ride in the app's layer)
    horovod/      (GPU) Horovod's sdist and our build recipe: NCCL builds happen in the image
    docker/, configs/
Images build with no Python package index: that is how air-gapped clusters build them, and
containers here cannot reach TLS registries anyway. The CPU image reuses the Horovod wheel
`make setup` cached (tools/horovod_wheel.py). An image is labelled with the hash of its build
context; `image` does nothing when the tagged image already carries the same hash.

Standard library only, like tools/horovod_wheel.py.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = ROOT / "build" / "docker"
INPUTS_LABEL = "org.hvdcls.inputs"  # the whole build context
DEPS_LABEL = "org.hvdcls.deps"  # the wheelhouse alone
DEFAULT_BASE = {False: "hvdcls/base:bookworm", True: "nvidia/cuda:13.0.1-cudnn-devel-ubuntu22.04"}
DEFAULT_TAG = {False: "hvdcls:latest", True: "hvdcls:gpu"}
SLURM_CONTEXT = ROOT / "docker" / "slurm"  # small: the Slurm image's build context is this folder
DEFAULT_SLURM_TAG = "hvdcls-slurm:latest"
PROMETHEUS_CONTEXT = ROOT / "docker" / "prometheus"  # Debian's prometheus on the base image
DEFAULT_PROMETHEUS_TAG = "hvdcls-prometheus:latest"


class ImageError(Exception):
    """A problem the user can fix; printed as one line."""


def say(message: str) -> None:
    print(f"[image] {message}", flush=True)


def requirement_files(gpu: bool) -> list[Path]:
    tf = "tensorflow-gpu" if gpu else "tensorflow"
    return [ROOT / "requirements" / f"{name}.txt" for name in ("core", "torch", tf)]


def pins(files: list[Path]) -> list[str]:
    lines = (line.split("#")[0].strip() for f in files for line in f.read_text().splitlines())
    return [line for line in lines if line]


def run(cmd: list[str], what: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        print(tail, file=sys.stderr)
        raise ImageError(f"{what} failed (exit {result.returncode}): {' '.join(cmd[:5])} ...")
    return result.stdout


def horovod_artifact(gpu: bool) -> Path:
    """CPU: the wheel `make setup` built and cached. GPU: the sdist, built inside the image
    (a GPU Horovod must be compiled against the image's CUDA and GPU TensorFlow)."""
    if gpu:
        sys.path.insert(0, str(ROOT / "tools"))
        import horovod_wheel
        return horovod_wheel.fetch_sdist(horovod_wheel.default_cache_dir())
    out = run([sys.executable, str(ROOT / "tools" / "horovod_wheel.py"), "--print-wheel"],
              "finding the cached Horovod wheel")
    return Path(out.strip().splitlines()[-1])


def stamp_of(files: list[Path], extra: list[str]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    digest.update(json.dumps(extra).encode())
    return digest.hexdigest()[:16]


def fill_wheelhouse(gpu: bool) -> tuple[Path, str]:
    """Download every dependency once (pip's cache keeps them across clean clones).

    Returns the Horovod artifact and the stamp naming what the wheelhouse holds."""
    wheelhouse, horovod = CONTEXT / "wheelhouse", horovod_artifact(gpu)
    files = requirement_files(gpu)
    stamp = stamp_of(files, [horovod.name, str(gpu), sys.version.split()[0]])
    stamp_file = wheelhouse / ".stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        say(f"wheelhouse up to date ({sum(1 for _ in wheelhouse.glob('*.whl'))} wheels)")
        return horovod, stamp
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir(parents=True)
    started = time.monotonic()
    say("downloading wheels into build/docker/wheelhouse")
    pip = [sys.executable, "-m", "pip"]
    args = [a for f in files for a in ("-r", str(f))]
    if not gpu:  # the cached wheel brings its own dependencies (psutil, cloudpickle, pyyaml)
        args.append(str(horovod))
    run([*pip, "download", "--quiet", "--dest", str(wheelhouse), *args], "pip download")
    # mpi4py compiled against Debian's OpenMPI, the one the image installs (pip caches the build).
    run([*pip, "wheel", "--quiet", "--no-binary", "mpi4py", "--wheel-dir", str(wheelhouse), "mpi4py>=4"],
        "building the mpi4py wheel")
    if gpu:  # horovodrun's own dependencies, for the build inside the image
        run([*pip, "download", "--quiet", "--dest", str(wheelhouse), "psutil", "cloudpickle", "pyyaml",
             "packaging", "cffi"], "pip download (Horovod's dependencies)")
    top_level = pins(files) + ["mpi4py>=4"] + ([] if gpu else ["horovod==0.28.1"])
    (wheelhouse / "requirements.txt").write_text("\n".join(top_level) + "\n")
    stamp_file.write_text(stamp)
    size = sum(p.stat().st_size for p in wheelhouse.iterdir()) / 1e9
    say(f"wheelhouse ready: {size:.1f} GB in {time.monotonic() - started:.0f} s")
    return horovod, stamp


def copy_tree(source: Path, target: Path, *ignored: str) -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*ignored))


def prepare_context(gpu: bool) -> str:
    """Lay out build/docker; returns the wheelhouse's stamp (what the dependencies are)."""
    horovod, deps = fill_wheelhouse(gpu)
    app = CONTEXT / "app"
    shutil.rmtree(app, ignore_errors=True)
    # setuptools stages the wheel in build/lib and never empties it: a module since moved or
    # deleted would still ship in the image.
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(app), str(ROOT)], "building the hvdcls wheel")
    # Not in the wheelhouse: that would change the deps stage, whose rebuild takes minutes and GBs.
    run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(app),
         "-r", str(ROOT / "requirements" / "serve.txt")], "pip download (the serve extra)")
    # The Slurm and Prometheus images' files, and the compose files, are not the app image's:
    # changing them must not rebuild it.
    copy_tree(ROOT / "docker", CONTEXT / "docker", "slurm", "prometheus", "*.yaml")
    copy_tree(ROOT / "configs", CONTEXT / "configs")
    recipe = CONTEXT / "horovod"
    shutil.rmtree(recipe, ignore_errors=True)
    if gpu:
        (recipe / "sdist").mkdir(parents=True)
        shutil.copy2(horovod, recipe / "sdist" / horovod.name)
        for name in ("horovod_wheel.py", "cxx_std_launcher.sh"):
            shutil.copy2(ROOT / "tools" / name, recipe / name)
    return deps


def context_hash() -> str:
    """What the image is made of: wheel names and sizes, our wheel's contents, the recipes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in CONTEXT.rglob("*") if p.is_file()):
        rel = path.relative_to(CONTEXT).as_posix()
        digest.update(rel.encode())
        if rel.startswith("wheelhouse/") and path.suffix == ".whl":
            digest.update(str(path.stat().st_size).encode())  # pinned names: size is enough
        elif rel.startswith("app/"):
            digest.update(wheel_contents_digest(path))  # wheels embed timestamps
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def wheel_contents_digest(wheel: Path) -> bytes:
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + archive.read(name))
    return digest.digest()


def inspect_image(tag: str, template: str) -> str | None:
    """One field of a local image (a Go template), or None when there is no such image."""
    result = subprocess.run(["docker", "image", "inspect", "--format", template, tag],
                            capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def image_id(tag: str) -> str | None:
    return inspect_image(tag, "{{.Id}}")


def image_label(tag: str, label: str) -> str | None:
    return inspect_image(tag, f'{{{{index .Config.Labels "{label}"}}}}')


def build_image(gpu: bool, base_image: str, tag: str, rebuild: bool) -> None:
    deps = prepare_context(gpu)
    inputs = f"{context_hash()}-{hashlib.sha256(base_image.encode()).hexdigest()[:8]}"
    if not rebuild and image_label(tag, INPUTS_LABEL) == inputs:
        say(f"{tag} is up to date ({inputs})")
        return
    if image_id(base_image) is None:
        hint = " (`make base-image` makes it)" if base_image == DEFAULT_BASE[False] else ""
        raise ImageError(f"base image {base_image} not found{hint}")
    if image_label(tag, DEPS_LABEL) not in (None, "", deps):
        # New dependencies: the build stage that installed the old wheelhouse is an untagged
        # leaf image (~11 GB) no build can reuse now. Same dependencies: keep it, it is the
        # cache that makes a code change a seconds-long rebuild.
        subprocess.run(["docker", "image", "prune", "--force"], capture_output=True)
    dockerfile = CONTEXT / "docker" / ("Dockerfile.gpu" if gpu else "Dockerfile")
    say(f"building {tag} from {base_image} (several minutes the first time)")
    docker_build(dockerfile, CONTEXT, tag, {"BASE_IMAGE": base_image}, {INPUTS_LABEL: inputs, DEPS_LABEL: deps},
                 ROOT / "build" / f"docker-build{'-gpu' if gpu else ''}.log")


def docker_build(dockerfile: Path, context: Path, tag: str, build_args: dict, labels: dict, log: Path) -> None:
    previous = image_id(tag)
    started = time.monotonic()
    # The classic builder: Debian's docker.io has no buildx, and we need no BuildKit feature.
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    cmd = ["docker", "build", "--file", str(dockerfile), "--tag", tag,
           *(a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")),
           *(a for k, v in labels.items() for a in ("--label", f"{k}={v}")), str(context)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        result = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        print("\n".join(log.read_text(errors="replace").splitlines()[-25:]), file=sys.stderr)
        raise ImageError(f"docker build failed (exit {result.returncode}); full log: {log}")
    if previous and previous != image_id(tag):
        # The replaced image is untagged now: drop it, or every rebuild leaves GBs behind. Its
        # build-stage layers stay (they are other images' parents) and cache the next build.
        subprocess.run(["docker", "image", "rm", previous], capture_output=True)
    size = int(inspect_image(tag, "{{.Size}}") or 0)
    say(f"{tag} built in {time.monotonic() - started:.0f} s, {size / 1e9:.2f} GB")


def build_small_image(what: str, context: Path, parent: str, build_arg: str, tag: str, rebuild: bool) -> None:
    """An image of one apt layer (and a few files) on top of `parent`, from the small build
    context `context`; rebuilt only when the parent image or the context's files change."""
    parent_id = image_id(parent)
    if parent_id is None:
        raise ImageError(f"image {parent} not found (`make {'base-image' if build_arg == 'BASE_IMAGE' else 'image'}`"
                         " makes it)")
    digest = hashlib.sha256(parent_id.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + path.read_bytes())
    inputs = digest.hexdigest()[:16]
    if not rebuild and image_label(tag, INPUTS_LABEL) == inputs:
        say(f"{tag} is up to date ({inputs})")
        return
    say(f"building {tag} from {parent} ({what})")
    docker_build(context / "Dockerfile", context, tag, {build_arg: parent},
                 {INPUTS_LABEL: inputs}, ROOT / "build" / f"docker-build-{context.name}.log")


def build_slurm_image(app_image: str, tag: str, rebuild: bool) -> None:
    """The app image plus Debian's Slurm and munge (docker/slurm/: one apt layer, seconds to
    a minute)."""
    build_small_image("apt-get install slurmctld slurmd munge", SLURM_CONTEXT, app_image, "HVDCLS_IMAGE",
                      tag, rebuild)


def build_prometheus_image(base_image: str, tag: str, rebuild: bool) -> None:
    """The base image plus Debian's prometheus and the compose cluster's scrape config
    (docker/prometheus/): the `prometheus` service of docker/compose.yaml."""
    build_small_image("apt-get install prometheus", PROMETHEUS_CONTEXT, base_image, "BASE_IMAGE", tag, rebuild)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["wheelhouse", "image", "slurm-image", "prometheus-image"])
    parser.add_argument("--gpu", action="store_true", help="CUDA image: Horovod with NCCL")
    parser.add_argument("--base-image", help="default: hvdcls/base:bookworm (CPU, prometheus-image), "
                        "a CUDA devel image (GPU)")
    parser.add_argument("--tag", help="default: hvdcls:latest (CPU), hvdcls:gpu (GPU); "
                        f"slurm-image: {DEFAULT_SLURM_TAG}; prometheus-image: {DEFAULT_PROMETHEUS_TAG}")
    parser.add_argument("--app-image", default=DEFAULT_TAG[False], help="slurm-image: the image it starts FROM")
    parser.add_argument("--rebuild", action="store_true", help="build even when the image is up to date")
    args = parser.parse_args(argv)
    try:
        if args.what == "wheelhouse":
            prepare_context(args.gpu)
        elif args.what == "slurm-image":
            build_slurm_image(args.app_image, args.tag or DEFAULT_SLURM_TAG, args.rebuild)
        elif args.what == "prometheus-image":
            build_prometheus_image(args.base_image or DEFAULT_BASE[False], args.tag or DEFAULT_PROMETHEUS_TAG,
                                   args.rebuild)
        else:
            build_image(args.gpu, args.base_image or DEFAULT_BASE[args.gpu],
                        args.tag or DEFAULT_TAG[args.gpu], args.rebuild)
    except ImageError as err:
        print(f"[image] error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
