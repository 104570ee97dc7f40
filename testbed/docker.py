"""Docker for tests on machines with no image registry: a private engine, a local base, our images.

Nothing can be pulled here, so everything an image needs is made on the machine:

- ``DockerDaemon`` starts Debian's ``dockerd`` (package ``docker.io``, installed by
  ``hack/install-system-deps.sh``) with its own data root under
  ``${TORCHKUBE_CACHE:-~/.cache/torchkube}/docker`` and its own socket, with no iptables rules and
  no bridge: containers use the host network or none, and nothing leaves the machine. A daemon
  already answering on that socket is reused and left running; one started here stops with
  :meth:`DockerDaemon.stop` (or with the process that started it). The data root persists, so
  the layer cache makes a second build of the same tree take seconds; untagged images and
  build cache beyond 20 GB are collected, so it does not grow without bound.
- ``ensure_base_image`` builds a Debian base with ``debootstrap`` + ``docker import``, tagged by
  a hash of its recipe, once per machine.
- ``build_image`` builds a target of the repository's Dockerfile with BuildKit; the machine's CA
  bundle goes to pip as a build secret, never into a layer.
- ``run_container`` runs one container to completion, on the host network or on none.

Every failure raises :class:`~testbed.errors.ClusterError` naming what could not be
installed, started, built or run, with the tail of its log -- never a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed.errors import ClusterError
from testbed.process import Process
from torchkube.local.logs import tail

INSTALL_HINT = "run hack/install-system-deps.sh (installs the docker.io and debootstrap packages)"
# The client from Debian's docker.io matches its 20.10 daemon and has BuildKit built in. A newer
# standalone client (there is one on PATH on these machines) needs the buildx plugin for
# BuildKit, which bookworm does not package.
DOCKER_CLIENT = Path("/usr/bin/docker")
# Searched in addition to PATH: a non-login root shell may not have the sbin folders.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where a build's pip finds the machine's CA bundle (on these machines a TLS-intercepting proxy
# signs PyPI's certificate, and the bundle inside the image does not know that CA).
DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PIP_CERT_SECRET_ID = "pip_cert"  # the Dockerfile's `RUN --mount=type=secret,id=pip_cert`

# The local base image: the smallest Debian that runs `python3 -m venv` (Python 3.11 in bookworm).
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Left out of the image, as in Docker's own debian:*-slim: 140 MB instead of 275 MB.
BASE_TRIM = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
)
BASE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["bash"]',
)
BASE_REPOSITORY = "torchkube/debian"

# The build cache is collected beyond 20 GB (room for about three generations of the 5.6 GB
# torch layer); dockerd collects its build cache only when configured to.
DAEMON_CONFIG = {"builder": {"gc": {"enabled": True, "defaultKeepStorage": "20GB"}}}

# A container without a network still gets a hostname that resolves, as every pod has:
# torchrun's rendezvous connects to its own hostname and waits 300 s when it cannot resolve it.
CONTAINER_HOSTNAME = "torchkube-test"
CONTAINER_LABEL = "io.testbed=1"

Report = Callable[[str], None]


def cache_root() -> Path:
    """``${TORCHKUBE_CACHE:-~/.cache/torchkube}``, shared with the venv and the cluster binaries."""
    return Path(os.environ.get("TORCHKUBE_CACHE") or Path.home() / ".cache" / "torchkube")


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}")


def require_system_tools(*names: str) -> dict[str, Path]:
    """Paths of the named executables, or a ClusterError that says how to install them."""
    found = {name: _which(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise ClusterError("system packages", f"{', '.join(missing)} not found; {INSTALL_HINT}")
    return {name: Path(path) for name, path in found.items() if path is not None}


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialise one step across processes (two test sessions, a person and CI) on one machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_logged(
    component: str,
    argv: Sequence[str],
    log_path: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run a command to completion with its output in ``log_path``; ClusterError on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(
                component, f"did not finish within {timeout:.0f} s", log_path, tail(log_path)
            ) from None
        except OSError as exc:
            raise ClusterError(component, f"cannot execute {argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise ClusterError(
            component, f"exited with code {proc.returncode}", log_path, tail(log_path)
        )


@dataclass(frozen=True)
class Docker:
    """A docker client talking to one daemon (``host`` is its ``unix://`` socket)."""

    host: str
    client: Path = DOCKER_CLIENT

    def argv(self, *args: str) -> list[str]:
        """The command line of ``docker ARGS`` against this daemon."""
        return [str(self.client), "--host", self.host, *args]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` with its output captured; the caller judges the exit code."""
        try:
            return subprocess.run(
                self.argv(*args), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(f"docker {args[0]}", f"no answer within {timeout:.0f} s") from None

    def check(self, *args: str, timeout: float = 120) -> str:
        """``docker ARGS``, returning stdout; ClusterError with its stderr when it fails."""
        proc = self.run(*args, timeout=timeout)
        if proc.returncode != 0:
            raise ClusterError(
                f"docker {args[0]}",
                f"exited with code {proc.returncode}",
                log_tail=proc.stderr or proc.stdout,
            )
        return proc.stdout

    def ping(self) -> bool:
        """Whether a daemon answers on the socket."""
        return self.run("version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0

    def image_exists(self, tag: str) -> bool:
        """Whether the daemon has an image with this tag."""
        return self.run("image", "inspect", "--format", "{{.Id}}", tag).returncode == 0

    def image_config(self, tag: str) -> dict[str, object]:
        """The image's config (``User``, ``Env``, ``Entrypoint``, ``Cmd``, ``WorkingDir``...)."""
        config: dict[str, object] = json.loads(
            self.check("image", "inspect", "--format", "{{json .Config}}", tag)
        )
        return config

    def image_size(self, tag: str) -> int:
        """Uncompressed size of the image in bytes, all layers included."""
        return int(self.check("image", "inspect", "--format", "{{.Size}}", tag))


class DockerDaemon:
    """A private ``dockerd``: own data root, socket, exec root and log; no iptables, no bridge.

    Sockets and the exec root live under ``/run/torchkube-docker-<hash of the data root>``: a
    Unix socket path may not exceed 108 bytes, which a long ``TORCHKUBE_CACHE`` would break.
    """

    def __init__(self, root: Path | None = None, report: Report | None = None):
        self.root = root or cache_root() / "docker"
        self.data_root = self.root / "data"
        self.log_path = self.root / "logs" / "dockerd.log"
        key = hashlib.sha256(str(self.data_root.resolve()).encode()).hexdigest()[:10]
        self.run_dir = Path("/run") / f"torchkube-docker-{key}"
        self.docker = Docker(f"unix://{self.run_dir / 'docker.sock'}")
        self._report = report or (lambda _message: None)
        self._process: Process | None = None

    def start(self, timeout: float = 60) -> Docker:
        """Reuse the daemon answering on this socket, or start one; return a client for it."""
        if not DOCKER_CLIENT.exists():
            raise ClusterError("docker client", f"{DOCKER_CLIENT} not found; {INSTALL_HINT}")
        dockerd = require_system_tools("dockerd")["dockerd"]
        with _file_lock(self.root / ".dockerd.lock"):
            if self.docker.ping():
                self._report(f"reusing dockerd on {self.docker.host}")
                return self.docker
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._clear_stale_pidfile()
            self.log_path.unlink(missing_ok=True)
            config = self.root / "daemon.json"
            config.write_text(json.dumps(DAEMON_CONFIG, indent=2) + "\n")
            self._process = Process(
                "dockerd",
                [
                    str(dockerd),
                    "--data-root",
                    str(self.data_root),
                    "--exec-root",
                    str(self.run_dir / "exec"),
                    "--pidfile",
                    str(self.run_dir / "dockerd.pid"),
                    "--host",
                    self.docker.host,
                    "--config-file",
                    str(config),
                    "--iptables=false",
                    "--ip6tables=false",
                    "--ip-masq=false",
                    "--bridge=none",
                ],
                self.log_path,
                env={**os.environ, "PATH": f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}"},
            ).start()
            started = time.monotonic()
            while not self.docker.ping():
                self._process.check_alive()
                if time.monotonic() - started > timeout:
                    self.stop()
                    raise ClusterError(
                        "dockerd",
                        f"not answering after {timeout:.0f} s",
                        self.log_path,
                        tail(self.log_path),
                    )
                time.sleep(0.2)
        self._report(f"dockerd up in {time.monotonic() - started:.1f} s on {self.docker.host}")
        return self.docker

    def _clear_stale_pidfile(self) -> None:
        """Remove the pid file of a daemon that died (dockerd refuses to start while it exists).

        A live dockerd that holds it but does not answer is an error: starting a second one on
        the same data root would corrupt it.
        """
        pidfile = self.run_dir / "dockerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            return
        try:
            command = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            command = ""
        if command == "dockerd":
            raise ClusterError(
                "dockerd",
                f"pid {pid} holds {pidfile} but does not answer on {self.docker.host}; stop it",
            )
        pidfile.unlink()

    def stop(self) -> None:
        """Stop the daemon if this object started it (its containers stop with it)."""
        if self._process is not None:
            self._process.stop(timeout=30)
            self._process = None


def base_image_tag() -> str:
    """The local base's tag: a hash of its recipe, so a recipe change builds a new one."""
    recipe = json.dumps([DEBIAN_SUITE, DEBIAN_MIRROR, BASE_PACKAGES, BASE_TRIM, BASE_CHANGES])
    return f"{BASE_REPOSITORY}:{DEBIAN_SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def ensure_base_image(docker: Docker, report: Report | None = None) -> str:
    """Return the tag of the local Debian base, building it first if this daemon lacks it.

    ``debootstrap --variant=minbase`` of bookworm with Python and CA certificates (about a
    minute), trimmed of docs, man pages, locales and apt's caches, then ``docker import``.
    """
    report = report or (lambda _message: None)
    tag = base_image_tag()
    if docker.image_exists(tag):
        return tag
    debootstrap = require_system_tools("debootstrap", "tar")
    work = cache_root() / "docker"
    with _file_lock(work / ".base-image.lock"):
        if docker.image_exists(tag):  # built by another process while this one waited
            return tag
        started = time.monotonic()
        rootfs = work / "rootfs.tmp"
        shutil.rmtree(rootfs, ignore_errors=True)
        log_path = work / "logs" / "debootstrap.log"
        try:
            _run_logged(
                "debootstrap",
                [
                    str(debootstrap["debootstrap"]),
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    DEBIAN_SUITE,
                    str(rootfs),
                    DEBIAN_MIRROR,
                ],
                log_path,
                timeout=900,
                env={**os.environ, "PATH": f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}"},
            )
            for relative in BASE_TRIM:
                for entry in (rootfs / relative).glob("*"):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
            _import_rootfs(docker, debootstrap["tar"], rootfs, tag, work / "logs" / "import.log")
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
    report(f"built base image {tag} in {time.monotonic() - started:.1f} s")
    return tag


def _import_rootfs(docker: Docker, tar: Path, rootfs: Path, tag: str, log_path: Path) -> None:
    """``tar -C ROOTFS -c . | docker import --change ... - TAG``, both ends checked."""
    changes = [arg for change in BASE_CHANGES for arg in ("--change", change)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        packer = subprocess.Popen(
            [str(tar), "-C", str(rootfs), "--numeric-owner", "-c", "."],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        assert packer.stdout is not None
        importer = subprocess.run(
            docker.argv("import", *changes, "-", tag),
            stdin=packer.stdout,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
        packer.stdout.close()
        packed = packer.wait()
    if packed != 0 or importer.returncode != 0:
        raise ClusterError(
            "docker import",
            f"tar exited {packed}, import {importer.returncode}",
            log_path,
            tail(log_path),
        )


def pip_ca_bundle() -> Path | None:
    """The CA bundle pip uses on this machine (``PIP_CERT``, else Debian's), if there is one."""
    configured = os.environ.get("PIP_CERT")
    for candidate in (Path(configured) if configured else None, DEFAULT_CA_BUNDLE):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class BuiltImage:
    """One finished ``docker build``: what was built, how long it took and how big it is."""

    tag: str
    target: str
    seconds: float
    size_bytes: int
    log_path: Path


def build_image(
    docker: Docker,
    context: Path,
    target: str,
    tag: str,
    build_args: Mapping[str, str],
    timeout: float = 3600,
    report: Report | None = None,
) -> BuiltImage:
    """Build one target of ``context/Dockerfile`` with BuildKit on the host network.

    ``--network host`` because the daemon has no bridge; pip is the only thing that reaches out
    (to the package index). The log of every build is kept under the cache's ``docker/logs``.
    """
    argv = ["build", "--network", "host", "--progress", "plain", "--target", target, "--tag", tag]
    for name, value in build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    bundle = pip_ca_bundle()
    if bundle is not None:
        argv += ["--secret", f"id={PIP_CERT_SECRET_ID},src={bundle}"]
    log_path = cache_root() / "docker" / "logs" / f"build-{target}.log"
    started = time.monotonic()
    _run_logged(
        f"docker build --target {target}",
        docker.argv(*argv, str(context)),
        log_path,
        timeout,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )
    built = BuiltImage(tag, target, time.monotonic() - started, docker.image_size(tag), log_path)
    # The previous image of this tag is now untagged; its layers would pile up build after build.
    docker.check("image", "prune", "--force")
    if report is not None:
        report(
            f"built {tag} (target {target}) in {built.seconds:.1f} s, "
            f"{built.size_bytes / 1e9:.2f} GB"
        )
    return built


def run_container(
    docker: Docker,
    image: str,
    args: Sequence[str] = (),
    *,
    network: Literal["none", "host"] = "none",
    volumes: Mapping[Path, str] | None = None,
    entrypoint: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``image`` with ``args`` to completion and return its exit code and output.

    The container is removed afterwards, and killed if it outlives ``timeout`` (then a
    ClusterError says so). ``volumes`` maps host folders to container paths.
    """
    name = f"torchkube-test-{secrets.token_hex(4)}"
    argv = ["run", "--rm", "--name", name, "--label", CONTAINER_LABEL, "--network", network]
    if network == "none":
        argv += ["--hostname", CONTAINER_HOSTNAME, "--add-host", f"{CONTAINER_HOSTNAME}:127.0.0.1"]
    for host_path, container_path in (volumes or {}).items():
        argv += ["--volume", f"{host_path}:{container_path}"]
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    try:
        return subprocess.run(
            docker.argv(*argv, image, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        docker.run("rm", "--force", name)
        output = exc.output or ""
        if isinstance(output, bytes):  # what was captured before the timeout comes undecoded
            output = output.decode(errors="replace")
        raise ClusterError(
            f"container of {image}",
            f"still running after {timeout:.0f} s (killed)",
            log_tail=output,
        ) from None
