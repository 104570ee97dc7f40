"""``spec.data`` of a TrainingJob: where the training text comes from, prepared by the job.

Without it the trainer reads ``trainer.dataPath`` from a volume someone filled by hand (or, with
neither, the bundled toy corpus). With it the operator runs ``torchkube prepare-data`` once, in
a pod of its own before any worker starts, into ``<checkpoint.mountPath>/<directory>`` on the
checkpoint volume, and points the trainer at the files it wrote. The step is idempotent: a
marker file on the volume (``PREPARED.json``) holds what was prepared from which source, so a
job re-created on the same claim starts training at once.
"""

from typing import Literal, Self

from pydantic import ConfigDict, Field, model_validator

from torchkube.api.base import ApiModel
from torchkube.api.types import DNS_SUBDOMAIN

Tokenizer = Literal["auto", "gpt2", "bytes"]

TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"


class ClaimSource(ApiModel):
    """Text on another PersistentVolumeClaim of the job's namespace, mounted read-only."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="The claim's name.")
    path: str = Field(
        default="",
        max_length=1024,
        pattern=r"^([^/].*)?$",
        description="A text file or folder of text files (.txt, .md, .rst) inside the claim; "
        "empty means the whole claim.",
    )


class HuggingFaceSource(ApiModel):
    """A dataset on the Hugging Face Hub, read row by row through its datasets server (no
    library needed in the image). For clusters that reach huggingface.co."""

    dataset: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[\w.-]+(/[\w.-]+)?$",
        description="The dataset's name, e.g. roneneldan/TinyStories.",
    )
    config: str = Field(default="default", max_length=256, description="The dataset's config.")
    split: str = Field(default="train", max_length=256, description="The split to read.")
    column: str = Field(default="text", max_length=256, description="The column holding text.")
    max_rows: int = Field(
        default=100_000, ge=1, le=10_000_000, description="Read at most this many rows."
    )


class DataSource(ApiModel):
    """Exactly one place to read text from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.path) ? 1 : 0) + (has(self.claim) ? 1 : 0) + "
                    "(has(self.url) ? 1 : 0) + (has(self.huggingFace) ? 1 : 0) == 1",
                    "message": "data.source needs exactly one of path, claim, url, huggingFace",
                }
            ]
        }
    )

    path: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^/",
        description="A text file or folder of text files (.txt, .md, .rst) inside the job's "
        "image (an image built FROM torchkube's trainer image with its corpus copied in).",
    )
    claim: ClaimSource | None = Field(default=None, description="A path on another claim.")
    url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://",
        description="An http(s) URL of a UTF-8 text file (gzip-compressed if it ends in .gz); "
        "each blank-line-separated paragraph is a document.",
    )
    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="A Hugging Face dataset, read through its datasets server."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        given = [self.path, self.claim, self.url, self.hugging_face]
        if sum(value is not None for value in given) != 1:
            raise ValueError("data.source needs exactly one of path, claim, url, huggingFace")
        return self

    def describe(self) -> str:
        """The source in a few words, for the status and events."""
        if self.path is not None:
            return f"image:{self.path}"
        if self.claim is not None:
            return f"claim:{self.claim.name}/{self.claim.path}".rstrip("/")
        if self.url is not None:
            return self.url
        assert self.hugging_face is not None
        hf = self.hugging_face
        return f"huggingface:{hf.dataset}/{hf.config}/{hf.split}[:{hf.max_rows}]"


class DataSpec(ApiModel):
    """Text the job prepares onto its checkpoint volume before the workers start."""

    source: DataSource = Field(description="Where the text comes from.")
    tokenizer: Tokenizer = Field(
        default="auto",
        description="gpt2: GPT-2 BPE through tiktoken (50257 tokens; its vocabulary must be "
        "installed or downloadable); bytes: one token per byte (257 tokens, always there); "
        "auto: gpt2 where its vocabulary is available, bytes otherwise. The status says which "
        "was used (status.data.tokenizer).",
    )
    val_fraction: float = Field(
        default=0.05,
        ge=0.0,
        le=0.5,
        description="Share of the tokens, from the end, written to val.bin for evaluation "
        "(0: no validation file).",
    )
    directory: str = Field(
        default="data",
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Folder on the checkpoint volume (under checkpoint.mountPath) for "
        "train.bin, val.bin and the PREPARED.json marker.",
    )

    def folder(self, mount_path: str) -> str:
        """Where the prepared files live, seen from a pod mounting the checkpoint volume at
        ``mount_path`` (or from ``torchkube run``, which passes its own folder)."""
        return f"{mount_path.rstrip('/')}/{self.directory}"
