"""A real node's containerd: its configuration, ``ctr`` against it, and the sandbox image.

No registry here, so the sandbox ("pause") image is a static binary written into a
docker-archive and imported with ``ctr``. This VM forbids negative ``oom_score_adj``:
``restrict_oom_score_adj = true``, or every sandbox fails in runc.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testbed.host import CNI_BIN_DIR, run, tool

PAUSE_REPOSITORY = "torchkube/pause"
IMAGE_ID_LABEL = "io.torchkube.docker-image-id"
"""What hack/load-images.sh (its ID_LABEL) labels an imported image with: its Docker ID."""
PAUSE_SOURCE = r"""
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"""


def pause_archive(directory: Path) -> tuple[Path, str]:
    """A docker-archive of the sandbox image (a static binary waiting for a signal).

    Built with the C compiler, no Docker needed; returns (archive path, image reference).
    """
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(PAUSE_SOURCE.encode()).hexdigest()[:12]
    ref = f"docker.io/{PAUSE_REPOSITORY}:{digest}"
    archive = directory / f"pause-{digest}.tar"
    if archive.is_file():
        return archive, ref
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "pause.c"
        source.write_text(PAUSE_SOURCE)
        binary = Path(tmp) / "pause"
        run([tool("gcc"), "-static", "-Os", "-s", "-o", str(binary), str(source)], "pause image")
        layer = io.BytesIO()
        with tarfile.open(fileobj=layer, mode="w") as tar:
            info = tar.gettarinfo(str(binary), arcname="pause")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with binary.open("rb") as handle:
                tar.addfile(info, handle)
    layer_bytes = layer.getvalue()
    layer_sha = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_sha}"]},
        }
    ).encode()
    config_sha = hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        [
            {
                "Config": f"{config_sha}.json",
                "RepoTags": [f"{PAUSE_REPOSITORY}:{digest}"],
                "Layers": [f"{layer_sha}/layer.tar"],
            }
        ]
    ).encode()
    partial = archive.with_suffix(".tmp")
    with tarfile.open(partial, mode="w") as tar:
        for name, data in (
            (f"{layer_sha}/layer.tar", layer_bytes),
            (f"{config_sha}.json", config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    partial.rename(archive)
    return archive, ref


@dataclass(frozen=True)
class LoadedImage:
    """One image made available on every real node (by ``hack/load-images.sh``)."""

    tag: str
    image_id: str
    size_bytes: int
    seconds: float
    """Wall time of the load: a ``docker save`` and the imports, or only the checks."""
    imported: list[str]
    """The nodes that imported it (the others already held this image ID)."""


def config_toml(
    root: Path, state: Path, socket: Path, sandbox_image: str, cni_conf_dir: Path
) -> str:
    """containerd's configuration for one node: its own root, state and socket."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[{cri}]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [{cri}.containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf_dir}"
"""


def names_tag(name: str, tag: str) -> bool:
    """Whether containerd's ``name`` is Docker's ``tag``: ``docker.io/[library/]`` before it
    unless its first part is a registry host, and ``:latest`` when it has no version (the rule
    hack/load-images.sh and the kubelet name images by)."""
    first, _, rest = tag.partition("/")
    if not rest:
        tag = f"docker.io/library/{tag}"
    elif "." not in first and ":" not in first and first != "localhost":
        tag = f"docker.io/{tag}"
    if ":" not in tag.rsplit("/", 1)[-1] and "@" not in tag:
        tag += ":latest"
    return name == tag


def ctr(socket: Path, *args: str) -> list[str]:
    """``ctr`` against the containerd at ``socket``, in the CRI namespace."""
    return [tool("ctr"), "--address", str(socket), "--namespace", "k8s.io", *args]
