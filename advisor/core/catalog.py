"""Model and GPU catalogs: resolve what the user names into exact specs.

The catalogs are data (``advisor/data/*.yaml``). Resolving a model never imports torch for a
catalog entry or a known architecture; only a local model of an architecture the ledger does not
know is counted by building it on the meta device.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from advisor.core.data_files import load_data_file
from advisor.core.errors import AdvisorInputError

MIB = 2**20


@lru_cache(maxsize=None)
def model_catalog() -> dict[str, dict[str, Any]]:
    return load_data_file("models.yaml")


@lru_cache(maxsize=None)
def gpu_catalog() -> dict[str, dict[str, Any]]:
    return load_data_file("gpus.yaml")


@lru_cache(maxsize=None)
def architectures() -> dict[str, dict[str, Any]]:
    return load_data_file("architectures.yaml")


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only language model, as much as memory planning needs to know of it."""

    name: str
    """Canonical name (catalog key, or the hub id of a catalogued variant, or the directory / hub id it was read from)."""
    hf_id: str
    """Hugging Face hub id, or the local path."""
    model_type: str
    """transformers `model_type` (llama, qwen2, qwen3, mistral, gemma2, phi3, ...)."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the MLP."""
    num_layers: int
    """Number of decoder layers."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (fewer than query heads under grouped-query attention)."""
    head_dim: int
    """Width of one attention head."""
    vocab_size: int
    """Rows of the embedding and of the output projection."""
    tie_word_embeddings: bool
    """The output projection shares the input embedding's weight."""
    max_position_embeddings: int
    """Longest context the model was built for."""
    params_total: int
    """Exact count of unique parameters (tied weights once)."""
    config: dict = field(default_factory=dict, compare=False, hash=False)
    """The config.json fields (with model_type) to build the model with transformers."""
    source: str = "catalog"
    """Where the spec came from: catalog, local, hf-cache."""
    path: str | None = None
    """Local directory holding config.json (and maybe weights and a tokenizer)."""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def arch(self) -> dict[str, Any] | None:
        """The ledger's knowledge of this architecture (architectures.yaml), if any."""
        return architectures().get(self.model_type)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear module in one decoder layer."""
        arch = self.arch
        if arch is None:
            raise AdvisorInputError(
                "--model", f"architecture {self.model_type!r} is not described in architectures.yaml", self.name
            )
        dims = {
            "hidden": self.hidden_size,
            "intermediate": self.intermediate_size,
            "q_dim": self.q_dim,
            "kv_dim": self.kv_dim,
            "qkv_dim": self.q_dim + 2 * self.kv_dim,
            "gate_up": 2 * self.intermediate_size,
        }
        return {name: (dims[i], dims[o]) for name, (i, o) in arch["linear_modules"].items()}

    @property
    def qkv_bias(self) -> bool:
        return bool(self.config.get("attention_bias", (self.arch or {}).get("attention_bias", False)))

    @property
    def o_bias(self) -> bool:
        rule = (self.arch or {}).get("o_bias", False)
        return self.qkv_bias if rule == "from_attention_bias" else bool(rule)

    def layer_bias_params(self) -> dict[str, int]:
        """Bias parameters of each linear module in one decoder layer."""
        shapes = self.linear_shapes()
        out: dict[str, int] = {}
        for name, (_, o) in shapes.items():
            if name in ("q_proj", "k_proj", "v_proj", "qkv_proj") and self.qkv_bias:
                out[name] = o
            elif name == "o_proj" and self.o_bias:
                out[name] = o
        return out

    def layer_norm_params(self) -> int:
        """Parameters of the norms of one decoder layer (qk-norms included)."""
        arch = self.arch or {}
        n = arch.get("norms_per_layer", 2) * self.hidden_size
        if arch.get("qk_norm"):
            n += 2 * self.head_dim
        return n

    def layer_linear_params(self) -> int:
        return sum(i * o for i, o in self.linear_shapes().values())

    def layer_params(self) -> int:
        return self.layer_linear_params() + sum(self.layer_bias_params().values()) + self.layer_norm_params()

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection that are not shared with the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def count_params(self) -> int:
        """Exact parameter count from the architecture fields (tests compare it with transformers)."""
        return (
            self.embedding_params
            + self.num_layers * self.layer_params()
            + self.hidden_size  # final norm
            + self.lm_head_params
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spec_from_config(name: str, hf_id: str, config: dict, source: str, path: str | None,
                      params_total: int | None, trust_remote_code: bool = False) -> ModelSpec:
    """The ModelSpec of a config.json's fields (parameters counted when ``params_total`` is None)."""
    where = "--model"
    try:
        model_type = config["model_type"]
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        spec = ModelSpec(
            name=name,
            hf_id=hf_id,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings") or 0),
            params_total=0,
            config=dict(config),
            source=source,
            path=path,
        )
    except KeyError as e:
        raise AdvisorInputError(where, f"config.json of {name} lacks the field {e.args[0]!r}", name,
                                show_value=False) from None
    except (TypeError, ValueError) as e:
        raise AdvisorInputError(where, f"config.json of {name} has a field of the wrong type ({e})", name,
                                show_value=False) from None
    if params_total is None:
        params_total = spec.count_params() if spec.arch else _count_params_meta(config, name, trust_remote_code)
    return replace(spec, params_total=params_total)


def _count_params_meta(config: dict, name: str, trust_remote_code: bool) -> int:
    """Count parameters of an architecture the ledger does not know by building it on the meta device."""
    import torch  # late: only for unknown architectures
    from transformers import AutoModelForCausalLM

    try:
        cfg = build_hf_config(config, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise AdvisorInputError("--model", f"transformers cannot build {name} ({e})", name, show_value=False) from e
    return sum(p.numel() for p in model.parameters())


def build_hf_config(config: dict, trust_remote_code: bool = False):
    """A transformers config object from config.json fields (no files read, nothing downloaded)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype", "dtype")}
    return AutoConfig.for_model(config["model_type"], **fields)


def _catalog_spec(key: str) -> ModelSpec:
    entry = model_catalog()[key]
    return spec_from_config(key, entry["hf_id"], entry["config"], "catalog", None, entry["params_total"])


def _read_config_json(path: Path, name: str) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AdvisorInputError("--model", f"{path} is not valid JSON ({e.msg} at line {e.lineno})", name,
                                show_value=False) from None
    except OSError as e:
        raise AdvisorInputError("--model", f"cannot read {path} ({e.strerror})", name, show_value=False) from None
    if not isinstance(config, dict):
        raise AdvisorInputError("--model", f"{path} must hold a JSON object", name, show_value=False)
    if "text_config" in config and "hidden_size" not in config:
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", config.get("model_type"))}
    return config


def _hf_cache_dirs() -> list[Path]:
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    roots.append(hf_home / "hub")
    return roots


def _find_in_hf_cache(hub_id: str) -> Path | None:
    """The newest snapshot of ``hub_id`` in the local Hugging Face cache that holds a config.json."""
    folder = "models--" + hub_id.replace("/", "--")
    for root in _hf_cache_dirs():
        snaps = root / folder / "snapshots"
        if snaps.is_dir():
            found = sorted((p for p in snaps.iterdir() if (p / "config.json").is_file()),
                           key=lambda p: p.stat().st_mtime, reverse=True)
            if found:
                return found[0]
    return None


def catalog_names() -> list[str]:
    names = []
    for key, entry in model_catalog().items():
        names += [key, entry["hf_id"], *entry.get("hf_variants", []), *entry.get("aliases", [])]
    return names


def resolve_model(name: str, trust_remote_code: bool = False) -> ModelSpec:
    """A catalog key, alias or hub id; a local directory with a config.json; or a hub id in the HF cache.

    Code shipped in a model directory is never run unless ``trust_remote_code`` is set.
    """
    if not name or not str(name).strip():
        raise AdvisorInputError("--model", "a model name, alias, hub id or directory is required", name)
    wanted = str(name).strip()
    lowered = wanted.lower()
    for key, entry in model_catalog().items():
        if lowered in (key, entry["hf_id"].lower(), *(a.lower() for a in entry.get("aliases", []))):
            return _catalog_spec(key)
        for variant in entry.get("hf_variants", []):
            if lowered == variant.lower():  # the base (or instruct) checkpoint of a catalogued architecture
                return replace(_catalog_spec(key), name=variant, hf_id=variant)
    path = Path(wanted).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise AdvisorInputError("--model", f"directory {path} has no config.json", wanted, show_value=False)
        config = _read_config_json(cfg_path, wanted)
        if config.get("auto_map") and not trust_remote_code and config.get("model_type") not in architectures():
            raise AdvisorInputError(
                "--model", f"{path} ships its own model code; pass --trust-remote-code to run it", wanted,
                show_value=False)
        return spec_from_config(path.name, str(path), config, "local", str(path), None, trust_remote_code)
    if "/" in wanted:
        snapshot = _find_in_hf_cache(wanted)
        if snapshot is not None:
            config = _read_config_json(snapshot / "config.json", wanted)
            return spec_from_config(wanted, wanted, config, "hf-cache", str(snapshot), None, trust_remote_code)
    close = difflib.get_close_matches(lowered, [n.lower() for n in catalog_names()], n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `advisor models` lists the catalog"
    raise AdvisorInputError("--model", f"unknown model (not in the catalog, not a directory, not in the local HF cache){hint}",
                            wanted)


# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuSpec:
    """A GPU model: what memory and speed planning needs."""

    key: str
    """Catalog key (or ``detected``)."""
    name: str
    """Marketing name as NVML reports it."""
    memory_bytes: int
    """Total device memory."""
    bf16: bool
    """Tensor cores support bfloat16 (Ampere, sm80, and newer)."""
    bf16_tflops: float | None
    """Dense BF16 tensor TFLOP/s (FP32 accumulate)."""
    fp16_tflops: float
    """Dense FP16 tensor TFLOP/s (FP32 accumulate)."""
    mem_bw_gbs: float
    """Device memory bandwidth, GB/s."""
    host_link_gbs: float
    """Host link bandwidth per direction, GB/s."""
    source: str
    """Where the figures come from."""
    detected: bool = False
    """Read from the GPU in this machine (NVML), not only from the catalog."""
    index: int | None = None
    """CUDA device index when detected."""
    nvlink_gbs: float | None = None
    """NVLink bandwidth per direction between GPUs, GB/s (None: collectives use the host link)."""
    tdp_w: float | None = None
    """Board power limit, W."""
    sustained_tflops: float | None = None
    """Dense fp16/bf16 tensor TFLOP/s a long GEMM sustains where the power limit holds the clock
    below the boost clock the datasheet peak assumes (None: not published; the peak is used)."""
    sm: int | None = None
    """CUDA compute capability, major * 10 + minor (75 for 7.5): what runs on the card
    (advisor.core.card_rules). None: unknown (a study stored before the field, NVML without it)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gpu_from_entry(key: str, entry: dict) -> GpuSpec:
    return GpuSpec(
        key=key,
        name=entry["name"],
        memory_bytes=int(entry["memory_mib"]) * MIB,
        bf16=bool(entry["bf16"]),
        bf16_tflops=entry.get("bf16_tflops"),
        fp16_tflops=float(entry["fp16_tflops"]),
        mem_bw_gbs=float(entry["mem_bw_gbs"]),
        host_link_gbs=float(entry["host_link_gbs"]),
        source=entry["source"],
        nvlink_gbs=entry.get("nvlink_gbs"),
        tdp_w=entry.get("tdp_w"),
        sustained_tflops=entry.get("sustained_tflops"),
        sm=entry.get("sm"),
    )


def gpu_names() -> list[str]:
    names = []
    for key, entry in gpu_catalog().items():
        names += [key, *map(str, entry.get("aliases", []))]
    return names


def resolve_gpu(name: str) -> GpuSpec:
    """A GPU from the catalog by key, alias or NVML name ("NVIDIA GeForce RTX 4090")."""
    wanted = str(name).strip().lower().replace("_", "-")
    for key, entry in gpu_catalog().items():
        if wanted in (key, entry["name"].lower(), *(str(a).lower() for a in entry.get("aliases", []))):
            return _gpu_from_entry(key, entry)
    close = difflib.get_close_matches(wanted, gpu_names(), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(gpu_catalog())}"
    raise AdvisorInputError("--gpu", f"unknown GPU{hint}", name)


def match_gpu_name(nvml_name: str) -> GpuSpec | None:
    """The catalog entry whose NVML name matches a detected GPU's name, if any."""
    lowered = nvml_name.lower()
    for key, entry in gpu_catalog().items():
        if entry["name"].lower() == lowered:
            return _gpu_from_entry(key, entry)
    return None


CUDA_DOUBLE_ENV = "ADVISOR_CUDA_DOUBLE"
"""Names a catalog GPU (``ADVISOR_CUDA_DOUBLE=rtx-4090``) to switch on the CUDA test double
(advisor/runtime/cuda_double.py): detection answers that GPU, and a probe asked for cuda runs its real step on
the CPU. Read in one place, ``cuda_double_gpu``; child processes inherit it."""
CUDA_DOUBLE_SUFFIX = " (cuda test double)"
"""Ends the name of the GPU the double stands for, so that no study, report or calibration entry made
through it reads as a real GPU's (the calibration files key on the name)."""


def cuda_double_gpu(index: int = 0) -> GpuSpec | None:
    """The catalog GPU the CUDA test double stands for, when ``$ADVISOR_CUDA_DOUBLE`` names one; else None.

    Its name ends with CUDA_DOUBLE_SUFFIX and its source says it is the double; it holds one device.
    """
    wanted = os.environ.get(CUDA_DOUBLE_ENV, "").strip()
    if not wanted or index != 0:
        return None
    try:
        gpu = resolve_gpu(wanted)
    except AdvisorInputError as e:
        raise AdvisorInputError(CUDA_DOUBLE_ENV, f"must name a catalog GPU ({e.rule.removeprefix('unknown GPU; ')})",
                                wanted) from None
    return replace(gpu, name=gpu.name + CUDA_DOUBLE_SUFFIX, detected=True, index=0,
                   source=f"{CUDA_DOUBLE_ENV}={wanted}: the CUDA test double (no GPU; probes run on the CPU) "
                          f"standing for the catalog's {gpu.name} ({gpu.source})")


def is_cuda_double(gpu: GpuSpec | str | None) -> bool:
    """Whether ``gpu`` (a GpuSpec or a GPU name) is the CUDA test double's."""
    name = gpu.name if isinstance(gpu, GpuSpec) else (gpu or "")
    return name.endswith(CUDA_DOUBLE_SUFFIX)


def detect_gpu(index: int = 0) -> GpuSpec | None:
    """The GPU in this machine through NVML (nvidia-ml-py), or None when there is none.

    With ``$ADVISOR_CUDA_DOUBLE`` set, the catalog GPU it names (``cuda_double_gpu``) instead of NVML's."""
    double = cuda_double_gpu(index)
    if double is not None:
        return double
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        return None
    try:
        if pynvml.nvmlDeviceGetCount() <= index:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        sm = _compute_capability(pynvml, handle)
    finally:
        pynvml.nvmlShutdown()
    known = match_gpu_name(name)
    if known is not None:
        return replace(known, memory_bytes=total, detected=True, index=index)
    gpu = GpuSpec(key="detected", name=name, memory_bytes=total, bf16=True, bf16_tflops=None,
                  fp16_tflops=0.0, mem_bw_gbs=0.0, host_link_gbs=16.0,
                  source="NVML (not in the catalog: speed unknown)", detected=True, index=index, sm=sm)
    from advisor.core.card_rules import bf16_runs

    return replace(gpu, bf16=bf16_runs(gpu))  # the one bf16 rule (card_rules.yaml), from NVML's compute capability


def _compute_capability(pynvml, handle) -> int | None:
    """NVML's CUDA compute capability as major * 10 + minor (None where the binding or driver lacks it)."""
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except Exception:  # noqa: BLE001 - AttributeError on old bindings, NVMLError_NotSupported
        return None
    return int(major) * 10 + int(minor)


BUDGET_MATCH = 0.95
"""A card matches a budget when its memory is at least this share of it: a "24GB" budget names a 24 GB card
whose usable memory is a little less (the RTX 4090's 24,564 MiB)."""


def gpu_for_budget(budget_bytes: int) -> GpuSpec:
    """The catalog GPU whose memory is closest to (and not below) a budget, for predictions."""
    gpus = [_gpu_from_entry(k, e) for k, e in gpu_catalog().items()]
    fitting = [g for g in gpus if g.memory_bytes >= budget_bytes * BUDGET_MATCH]
    pool = fitting or gpus
    return min(pool, key=lambda g: (abs(g.memory_bytes - budget_bytes), -(g.bf16_tflops or 0)))
