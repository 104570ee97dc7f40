"""``spec.trainer`` of a TrainingJob: everything the built-in trainer needs to know.

This model is the trainer's only configuration tree: the operator renders it into the pods as
JSON (``TORCHKUBE_TRAINER_CONFIG``) and ``python -m torchkube.trainer`` validates it again on
start-up, so a spec that passed ``kubectl apply`` means the same thing inside the pod.
Runtime facts that belong to the pod rather than to the job (checkpoint folder, intervals,
metrics port, torchrun's rank variables) come from the environment instead; see
``torchkube.trainer.loader``.

Batch sizes count sequences of ``seqLen`` tokens. The optimizer always sees
``globalBatchSize`` sequences per step; the trainer derives the gradient-accumulation steps
from the world size it finds, so an elastic resize changes the accumulation, never the batch.
Any world size works: when it does not divide the global batch, ranks hold one sequence more
or less (see :func:`micro_steps`).
"""

from typing import Literal, Self

from pydantic import ConfigDict, Field, model_validator

from torchkube.api.base import ApiModel

ModelPreset = Literal[
    "tiny",
    "small",
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "llama-tiny",
    "mistral-tiny",
    "llama-small",
    "llama-1b",
    "llama-7b",
    "llama3-8b",
    "mistral-7b",
]
LLAMA_FAMILY_PREFIXES = ("llama", "mistral")  # presets of torchkube.trainer.llama
Strategy = Literal["ddp", "zero1", "fsdp", "hsdp"]
ActivationCheckpointing = Literal["none", "selective", "full"]
Precision = Literal["auto", "bf16", "fp32"]
Device = Literal["auto", "cuda", "cpu"]
LrSchedule = Literal["cosine", "linear", "constant"]


def is_llama_family(model: str) -> bool:
    """Whether a preset is a Llama/Mistral-family decoder (``llama.py``) rather than a GPT."""
    return model.startswith(LLAMA_FAMILY_PREFIXES)


def micro_steps(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """Micro-steps every worker runs per optimizer step: the fewest that hold the global batch
    in micro-batches of at most ``micro_batch_size`` sequences, the same on every worker."""
    return max(1, -(-global_batch_size // (micro_batch_size * world_size)))


# Cross-field rules as CEL, so `kubectl apply` rejects what the validator below rejects.
_CEL_RULES = [
    (
        "self.globalBatchSize % self.microBatchSize == 0",
        "trainer.globalBatchSize must be a multiple of trainer.microBatchSize",
    ),
    ("self.warmupSteps <= self.steps", "trainer.warmupSteps must not exceed trainer.steps"),
    (
        "!has(self.hsdpShardSize) || self.strategy == 'hsdp'",
        "trainer.hsdpShardSize is only used with strategy hsdp",
    ),
    (
        "!(self.evalIntervalSteps > 0 && has(self.dataPath) && !has(self.evalDataPath))",
        "trainer.evalIntervalSteps > 0 needs trainer.evalDataPath when trainer.dataPath is set",
    ),
    (
        "self.parallelism.tensor == 1 || self.model.startsWith('llama') || "
        "self.model.startsWith('mistral')",
        "trainer.parallelism.tensor > 1 needs a Llama-family model (llama-*, mistral-*): "
        "the GPT has no tensor-parallel plan",
    ),
    (
        "self.parallelism.tensor == 1 || self.strategy != 'zero1'",
        "trainer.parallelism.tensor > 1 works with strategy fsdp, hsdp or ddp, not zero1",
    ),
    (
        "self.seqLen % self.parallelism.tensor == 0",
        "trainer.seqLen must be a multiple of trainer.parallelism.tensor (sequence parallelism "
        "splits every sequence over the tensor ranks)",
    ),
    (
        "!has(self.weightsPath) || self.model.startsWith('llama') || "
        "self.model.startsWith('mistral')",
        "trainer.weightsPath needs a Llama-family model (llama-*, mistral-*)",
    ),
    (
        "!has(self.exportFormat) || self.model.startsWith('llama') || "
        "self.model.startsWith('mistral')",
        "trainer.exportFormat needs a Llama-family model (llama-*, mistral-*)",
    ),
    (
        "self.dropout == 0.0 || !(self.model.startsWith('llama') || "
        "self.model.startsWith('mistral'))",
        "trainer.dropout must be 0 for a Llama-family model, which has no dropout",
    ),
]


class ParallelismSpec(ApiModel):
    """Model parallelism inside a pod; data parallelism (``strategy``) spans the rest."""

    tensor: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Tensor-parallel ranks: each layer's matrices are split over this many consecutive "
            "processes of one pod (a 2-D mesh, data × tensor), so a resize changes only the "
            "data dimension. Must divide nprocPerNode and the GPUs per pod; Llama-family "
            "models only; strategy fsdp, hsdp (both shard over the data dimension) or ddp "
            "(replicates over it), not zero1."
        ),
    )


class TrainerSpec(ApiModel):
    """What to train, how to parallelise it, and the optimisation recipe."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": r, "message": m} for r, m in _CEL_RULES]
        }
    )

    # Model
    model: ModelPreset = Field(
        default="gpt2",
        description=(
            "Model preset. GPT: tiny (tests, ~0.1M parameters), small (~10M), gpt2 (124M), "
            "gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1.5B). Llama family (RMSNorm, "
            "rotary embeddings, SwiGLU, grouped-query attention): llama-tiny and "
            "mistral-tiny (tests; mistral-* with a sliding attention window), llama-small, "
            "llama-1b (Llama 3.2 1B's shape), llama-7b (Llama 2 7B), llama3-8b, mistral-7b. "
            "Parameter counts exclude the vocabulary, which the data sets (vocabSize); with "
            "weightsPath the shape is the folder's config.json."
        ),
    )
    vocab_size: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description=(
            "Vocabulary size of the model. Unset: read from the token file's header "
            "(257 for files made by `torchkube prepare-data`), padded up to a multiple of 64."
        ),
    )
    dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout probability inside the model (GPT presets only).",
    )
    weights_path: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Folder of Hugging Face-format weights to start from (config.json and "
            "*.safetensors, e.g. on the checkpoint claim): the model's shape comes from its "
            "config.json, and its tokenizer, when the folder has one, must be the one the "
            "data was tokenised with. Read shard by shard into the sharded model; a resume "
            "from a checkpoint ignores it. Llama-family models only."
        ),
    )

    export_format: Literal["hf"] | None = Field(
        default=None,
        description=(
            "Export the final checkpoint at the end of training onto the checkpoint volume, "
            "as hf-step-N/ beside the step-N/ checkpoints: hf, a Hugging Face folder "
            "(config.json, safetensors weights, and weightsPath's tokenizer files when it "
            "has them) that transformers' AutoModelForCausalLM loads. Any checkpoint can "
            "also be exported later: torchkube export CHECKPOINT --format hf OUT. Llama-family "
            "models only."
        ),
    )

    # Parallelism and system
    strategy: Strategy = Field(
        default="ddp",
        description=(
            "How the model is spread over the workers (over the data dimension when "
            "parallelism.tensor > 1): ddp (replicated), zero1 (DDP with the optimizer state "
            "sharded by ZeroRedundancyOptimizer), fsdp (FSDP2 fully_shard over all workers), "
            "hsdp (FSDP2 on a 2-D mesh: shard inside a group of hsdpShardSize workers, "
            "replicate across groups)."
        ),
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description="Tensor parallelism inside a pod (see docs/trainer.md, choosing a "
        "parallelism).",
    )
    activation_checkpointing: ActivationCheckpointing = Field(
        default="none",
        description=(
            "Recompute activations in backward instead of keeping them: none; selective "
            "(keep matmul and attention outputs, recompute the cheap element-wise ops and "
            "norms); full (keep only each block's input, recompute the whole block, about "
            "a third more compute)."
        ),
    )
    hsdp_shard_size: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description=(
            "Workers per HSDP shard group (strategy hsdp only), counted along the data "
            "dimension. Unset: the data-parallel ranks of one node (torchrun's "
            "LOCAL_WORLD_SIZE / parallelism.tensor), so sharding stays on the fast intra-node "
            "links."
        ),
    )
    precision: Precision = Field(
        default="auto",
        description=(
            "Compute precision: bf16 (autocast / FSDP2 mixed precision, fp32 master weights "
            "and gradient reduction), fp32, or auto (bf16 on CUDA, fp32 on CPU)."
        ),
    )
    device: Device = Field(
        default="auto",
        description="cuda (one GPU per process, NCCL), cpu (gloo), or auto (cuda when present).",
    )
    compile: bool = Field(
        default=False,
        description="Compile the model with torch.compile: each transformer block apart where "
        "data parallelism spans processes (its hooks run between them), the whole model in a "
        "single process.",
    )
    ddp_bucket_size_mb: int = Field(
        default=25,
        ge=1,
        le=1024,
        description="DDP gradient bucket size in MiB (ddp and zero1).",
    )
    deterministic: bool = Field(
        default=False,
        description=(
            "Use deterministic kernels only (torch.use_deterministic_algorithms), for bitwise "
            "reproducible resumes; slower on GPU."
        ),
    )
    collective_timeout_seconds: int = Field(
        default=600,
        ge=10,
        le=86400,
        description="Timeout of one collective before a hung peer is declared dead.",
    )

    # Batch and schedule
    micro_batch_size: int = Field(
        default=8, ge=1, le=65536, description="Sequences per worker per forward/backward pass."
    )
    global_batch_size: int = Field(
        default=64,
        ge=1,
        le=16_777_216,
        description=(
            "Sequences per optimizer step over all workers; kept constant across resizes. "
            "Any world size works: when it does not divide this, workers hold one sequence "
            "more or less, and each worker's loss counts by its share of the batch."
        ),
    )
    seq_len: int = Field(
        default=1024, ge=8, le=131_072, description="Tokens per sequence (the model's context)."
    )
    steps: int = Field(
        default=1000, ge=1, le=1_000_000_000, description="Optimizer steps to train for."
    )

    # Optimizer (AdamW) and learning-rate schedule
    learning_rate: float = Field(
        default=6e-4, gt=0.0, le=1.0, description="Peak learning rate, reached after warm-up."
    )
    min_learning_rate_ratio: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Final learning rate as a fraction of learningRate (cosine and linear).",
    )
    lr_schedule: LrSchedule = Field(
        default="cosine",
        description="Decay after warm-up, from learningRate down to the final learning rate.",
    )
    warmup_steps: int = Field(
        default=100, ge=0, le=1_000_000_000, description="Linear warm-up steps."
    )
    weight_decay: float = Field(
        default=0.1,
        ge=0.0,
        le=10.0,
        description="AdamW weight decay, applied to matrices and embeddings only.",
    )
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0, description="AdamW beta2.")
    grad_clip: float = Field(
        default=1.0, ge=0.0, le=1e6, description="Gradient-norm clipping threshold; 0 turns it off."
    )

    # Data
    data_path: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Token file (or glob of shard files) written by `torchkube prepare-data` or llm.c. "
            "Unset: a small generated sample corpus (quick start and tests)."
        ),
    )
    eval_data_path: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Token file (or glob) for evaluation. Unset: the sample corpus' validation split "
            "when dataPath is unset, otherwise no evaluation."
        ),
    )
    eval_interval_steps: int = Field(
        default=0, ge=0, le=1_000_000_000, description="Evaluate every N steps; 0 turns it off."
    )
    eval_batches: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        description=(
            "Size of the evaluation set in micro-batches: the first evalBatches × "
            "microBatchSize sequences of the evaluation data, split over the workers, the "
            "same samples at any world size."
        ),
    )
    seed: int = Field(
        default=1337,
        ge=0,
        le=2**31 - 1,
        description=(
            "Seed of the model initialisation and of the data order; worker N draws dropout "
            "from seed + N."
        ),
    )
    allow_dataset_change: bool = Field(
        default=False,
        description=(
            "Resume from a checkpoint trained on other data (other files or sizes than "
            "dataPath now gives). Off: such a resume fails, since it would silently change "
            "which samples come next."
        ),
    )

    # Logging (checkpoints are spec.checkpoint's)
    log_interval_steps: int = Field(
        default=10, ge=1, le=1_000_000, description="Log a progress line every N steps."
    )
    tensorboard: bool = Field(
        default=False,
        description=(
            "Also write the progress line's numbers (loss, learning rate, grad norm, "
            "tokens/s, MFU; and the eval loss) as TensorBoard scalars every logIntervalSteps, "
            "into tensorboard/ under the checkpoint folder, so that tensorboard --logdir on "
            "the claim shows them. Written by the trainer itself: no package needed."
        ),
    )

    @model_validator(mode="after")
    def _check_cross_field_rules(self) -> Self:
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"globalBatchSize ({self.global_batch_size}) must be a multiple of "
                f"microBatchSize ({self.micro_batch_size})"
            )
        if self.warmup_steps > self.steps:
            raise ValueError(
                f"warmupSteps ({self.warmup_steps}) must not exceed steps ({self.steps})"
            )
        if self.hsdp_shard_size is not None and self.strategy != "hsdp":
            raise ValueError(
                f"hsdpShardSize is only used with strategy hsdp (strategy is {self.strategy})"
            )
        if self.eval_interval_steps and self.data_path and not self.eval_data_path:
            raise ValueError("evalIntervalSteps > 0 needs evalDataPath when dataPath is set")
        self._check_model_parallel_rules()
        return self

    def _check_model_parallel_rules(self) -> None:
        """The rules of tensor parallelism and of the Llama family (CEL rules alike)."""
        tensor, llama = self.parallelism.tensor, is_llama_family(self.model)
        if tensor > 1 and not llama:
            raise ValueError(
                f"parallelism.tensor > 1 needs a Llama-family model (llama-*, mistral-*), not "
                f"{self.model}: the GPT has no tensor-parallel plan"
            )
        if tensor > 1 and self.strategy == "zero1":
            raise ValueError(
                "parallelism.tensor > 1 works with strategy fsdp, hsdp or ddp, not zero1"
            )
        if self.seq_len % tensor:
            raise ValueError(
                f"seqLen ({self.seq_len}) must be a multiple of parallelism.tensor ({tensor}): "
                "sequence parallelism splits every sequence over the tensor ranks"
            )
        if self.weights_path and not llama:
            raise ValueError(f"weightsPath needs a Llama-family model, not {self.model}")
        if self.export_format and not llama:
            raise ValueError(f"exportFormat needs a Llama-family model, not {self.model}")
        if self.dropout and llama:
            raise ValueError(
                f"dropout must be 0 for a Llama-family model ({self.model}), which has no dropout"
            )

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step at ``world_size`` workers (:func:`micro_steps`)."""
        return micro_steps(self.global_batch_size, self.micro_batch_size, world_size)

    @property
    def tokens_per_step(self) -> int:
        """Tokens the optimizer sees per step, whatever the world size."""
        return self.global_batch_size * self.seq_len
