"""Model and GPU catalogs: resolve what the user names into exact specs.

The catalogs are data (``advisor/data/*.yaml``). A model's structure is derived from transformers
(advisor.core.architecture); resolving a catalog model reads its stored description and imports no torch, and
any other config is built once on the meta device and kept in the user cache (advisor.core.architecture_store).
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from advisor.core.architecture import ArchitectureDescription, MoeFacts, config_key, config_object
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
def architecture_facts() -> dict[str, dict[str, Any]]:
    """What a meta-device build cannot say (architectures.yaml), each entry with its source."""
    return load_data_file("architectures.yaml")


@lru_cache(maxsize=None)
def architectures() -> dict[str, dict[str, Any]]:
    """``ModelSpec.arch`` of each catalog ``model_type`` (its first catalog model's), derived: the norms, q/k norms,
    activation, soft-capping and LoRA target sets the ledger and the search read by architecture."""
    out: dict[str, dict[str, Any]] = {}
    for key, entry in model_catalog().items():
        model_type = entry["config"]["model_type"]
        if model_type not in out:
            out[model_type] = _catalog_spec(key).arch
    return out


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only language model, as much as memory planning needs to know of it.

    The fields are the config's, as transformers builds the model (its config class's defaults filled in). What a
    decoder layer holds (linear modules, norms, experts, attention kind, cache) is ``description``: derived from a
    meta-device build of ``config`` (advisor.core.architecture), read from the stored catalog descriptions or the
    user cache (advisor.core.architecture_store) without importing torch where it was derived before.
    """

    name: str
    """Canonical name (catalog key, or the hub id of a catalogued variant, or the directory / hub id it was read
    from)."""
    hf_id: str
    """Hugging Face hub id, or the local path."""
    model_type: str
    """transformers `model_type` (llama, qwen2, qwen3, qwen3_moe, gpt_oss, gemma3_text, ...)."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the dense MLP (the config's ``intermediate_size``; an expert's width is in ``moe``)."""
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
    processor: dict = field(default_factory=dict, compare=False, hash=False)
    """A vision-language model's image (and video) processor settings (models.yaml ``processor``: the class and its
    preprocessor_config.json fields); empty for a text model."""
    config_key: str = ""
    """Key of ``config`` (advisor.core.architecture.config_key): two specs that differ only in their config (a tiny
    model's sliding window) are not equal, so caches keyed by the spec tell them apart."""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ------------------------------------------------------------------ derived from the meta-device build

    @cached_property
    def description(self) -> ArchitectureDescription:
        """The model's structure, derived from transformers (stored for the catalog, cached for the rest)."""
        from advisor.core.architecture_store import description_for

        return description_for(self.config)[0]

    @cached_property
    def _shapes(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for layer, _ in self.description.layer_kinds():
            for m in layer.linears:
                out.setdefault(m.short, (m.in_features, m.out_features))
        return out

    @cached_property
    def _biases(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for layer, _ in self.description.layer_kinds():
            for m in layer.linears:
                if m.bias:
                    out.setdefault(m.short, m.out_features)
        return out

    @cached_property
    def _arch(self) -> dict[str, Any]:
        d = self.description
        first = d.layers[0]
        sets: dict[str, list[str]] = {"attention": [], "mlp": []}
        for layer, _ in d.layer_kinds():
            for m in layer.linears:
                role = {"attention": "attention", "mlp": "mlp", "shared_experts": "mlp"}.get(m.role)
                if role and m.short not in sets[role]:
                    sets[role].append(m.short)
        return {
            "norms_per_layer": sum(1 for n in first.norms if not n.is_qk_norm),
            "qk_norm": any(n.is_qk_norm for n in first.norms),
            "mlp_activation": d.hidden_act,
            "logit_softcap": bool(d.final_logit_softcapping),
            "lora_target_sets": {k: v for k, v in sets.items() if v},
        }

    @property
    def arch(self) -> dict[str, Any]:
        """The facts the ledger and the search read by architecture, derived from ``description``:
        ``norms_per_layer`` (norms over the hidden width in one decoder layer), ``qk_norm`` (norms over the queries
        and keys), ``mlp_activation``, ``logit_softcap``, ``lora_target_sets`` (attention / mlp module names by the
        role of each linear)."""
        return self._arch

    @property
    def vision(self):
        """The vision tower and projector (advisor.core.vision_architecture.VisionFacts), None for a text model."""
        return self.description.vision

    @property
    def is_vision_language(self) -> bool:
        return self.description.vision is not None

    @property
    def params_loaded(self) -> int:
        """Every parameter the checkpoint loads: the language model's (``params_total``) and a vision-language
        model's tower and projector."""
        return self.params_total + (self.vision.params if self.is_vision_language else 0)

    def summary(self) -> dict:
        """The model as every command's JSON and header name it: ``params_total`` is every parameter loaded (a
        vision-language model's tower included), with the language model's share beside it where they differ."""
        out = {"name": self.name, "hf_id": self.hf_id, "params_total": self.params_loaded}
        if self.is_vision_language:
            out.update(params_language_model=self.params_total, params_vision=self.vision.params)
        return out

    @property
    def is_moe(self) -> bool:
        """Some decoder layers route tokens to stacked experts."""
        return self.description.is_moe

    @property
    def moe(self) -> MoeFacts | None:
        """Experts, top-k, expert width, shared experts and dense layers of a mixture of experts (None: dense)."""
        return self.description.moe

    def supports_attention(self, impl: str) -> bool:
        """Whether transformers accepts ``attn_implementation=impl`` for this model class (the class's
        ``_supports_sdpa`` / ``_supports_flash_attn`` / ``_supports_flex_attn``; eager always)."""
        return self.description.supports_attention(impl)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear module of a decoder layer, by short name, in the order the
        forward calls them (every layer's, the first layer's shape where layers of two kinds share a name)."""
        return dict(self._shapes)

    @property
    def qkv_bias(self) -> bool:
        return any(self._biases.get(n) for n in ("q_proj", "k_proj", "v_proj", "qkv_proj"))

    @property
    def o_bias(self) -> bool:
        return bool(self._biases.get("o_proj"))

    def layer_bias_params(self) -> dict[str, int]:
        """Bias parameters of each linear module in one decoder layer."""
        return dict(self._biases)

    def layer_norm_params(self) -> int:
        """Parameters of the norms of one decoder layer (qk-norms included; the first layer's)."""
        return self.description.layers[0].norm_params

    def layer_linear_params(self) -> int:
        return sum(i * o for i, o in self.linear_shapes().values())

    def layer_params(self) -> int:
        """Parameters of one decoder layer (the first layer's)."""
        return self.description.layers[0].params

    @property
    def embedding_params(self) -> int:
        return self.description.embedding_params

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection that are not shared with the embedding."""
        return self.description.lm_head_params

    def count_params(self) -> int:
        """Exact parameter count from the description (every layer, the embedding, the final norm, the head)."""
        d = self.description
        return d.embedding_params + sum(layer.params for layer in d.layers) + d.final_norm_params + d.lm_head_params

    def to_dict(self) -> dict[str, Any]:
        """Its fields; a text model's empty ``processor`` left out (a study stored before vision-language models
        reads, hashes and writes back as it was)."""
        d = asdict(self)
        if not d["processor"]:
            del d["processor"]
        return d


REQUIRED_FIELDS = ("model_type", "hidden_size", "num_hidden_layers")
"""config.json fields without which a config describes no model (the rest fall back to transformers' defaults of the
config class, as transformers itself builds the model)."""
INT_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "max_position_embeddings")


def spec_from_config(name: str, hf_id: str, config: dict, source: str, path: str | None,
                      params_total: int | None, trust_remote_code: bool = False,
                      processor: dict | None = None) -> ModelSpec:
    """The ModelSpec of a config.json's fields, from its derived description (``params_total``, when given, is
    the catalog's figure: tests/test_catalog_models.py checks it against the description)."""
    where = "--model"
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key in REQUIRED_FIELDS:
        if key not in text and key not in config:
            raise AdvisorInputError(where, f"config.json of {name} lacks the field {key!r}", name, show_value=False)
    for key in INT_FIELDS:
        value = text.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise AdvisorInputError(where, f"config.json of {name} has a field of the wrong type ({key} must be a "
                                    f"whole number, got {value!r})", name, show_value=False)
    from advisor.core.architecture_store import description_for

    try:
        desc, _ = description_for(config, trust_remote_code=trust_remote_code)
    except AdvisorInputError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for a config it cannot build
        raise AdvisorInputError(where, f"transformers cannot build {name} ({type(e).__name__}: {e})", name,
                                show_value=False) from e
    spec = ModelSpec(
        name=name, hf_id=hf_id, model_type=desc.model_type, hidden_size=desc.hidden_size,
        intermediate_size=desc.intermediate_size, num_layers=desc.num_layers, num_heads=desc.num_heads,
        num_kv_heads=desc.num_kv_heads, head_dim=desc.head_dim, vocab_size=desc.vocab_size,
        tie_word_embeddings=desc.tie_word_embeddings, max_position_embeddings=desc.max_position_embeddings,
        params_total=desc.params_total if params_total is None else int(params_total), config=dict(config),
        source=source, path=path, processor=dict(processor or {}), config_key=config_key(config))
    spec.__dict__["description"] = desc  # the cached_property, filled: no second lookup
    return spec


def build_hf_config(config: dict, trust_remote_code: bool = False):
    """A transformers config object from config.json fields (no files read, nothing downloaded)."""
    return config_object(config)


def _catalog_spec(key: str) -> ModelSpec:
    entry = model_catalog()[key]
    return spec_from_config(key, entry["hf_id"], entry["config"], "catalog", None, entry["params_total"],
                            processor=entry.get("processor"))


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
        config = {**config["text_config"],
                  "model_type": config["text_config"].get("model_type", config.get("model_type"))}
    return config


def _transformers_knows(model_type: str | None) -> bool:
    """transformers has a config class for ``model_type`` (its own code, no remote code needed)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


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
        if config.get("auto_map") and not trust_remote_code and not _transformers_knows(config.get("model_type")):
            raise AdvisorInputError(
                "--model", f"{path} ships its own model code; pass --trust-remote-code to run it", wanted,
                show_value=False)
        return spec_from_config(path.name, str(path), config, "local", str(path), None, trust_remote_code)
    if "/" in wanted:
        snapshot, source = _find_in_hf_cache(wanted), "hf-cache"
        if snapshot is None and not _offline():
            snapshot, source = fetch_from_hub(wanted), "hub"
        if snapshot is not None:
            config = _read_config_json(snapshot / "config.json", wanted)
            return spec_from_config(wanted, wanted, config, source, str(snapshot), None, trust_remote_code,
                                    processor=processor_in(snapshot))
    close = difflib.get_close_matches(lowered, [n.lower() for n in catalog_names()], n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `advisor models` lists the catalog"
    offline = ("; offline (HF_HUB_OFFLINE): give a local folder holding its config.json (huggingface-cli download "
               f"{wanted} config.json --local-dir DIR on a machine online)" if "/" in wanted and _offline() else "")
    raise AdvisorInputError("--model",
                            f"unknown model (not in the catalog, not a directory, not in the local HF cache){offline}"
                            f"{hint}", wanted)


def _offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub reads it, at the time of asking."""
    return any(os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


HUB_FILES = ("config.json", "preprocessor_config.json", "video_preprocessor_config.json")
"""What describes a model to the advisor: its config, and a vision-language model's image and video processors."""


def fetch_from_hub(hub_id: str) -> Path:
    """Download ``hub_id``'s config.json (and its processors' configs where it has them) into the Hugging Face
    cache (``$HF_HOME/hub``, ``$HF_ENDPOINT``'s Hub), as huggingface_hub does; the snapshot folder. A model the Hub
    does not have, a gated one, or no network is a clear --model error."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError)

    # huggingface_hub reads these when imported; the advisor asks them now (a test, a caller may set them later)
    constants.HF_HUB_OFFLINE = _offline()
    cache, endpoint = _hf_cache_dirs()[-1], os.environ.get("HF_ENDPOINT") or None
    if not constants.HF_HUB_OFFLINE and not _reachable(endpoint or constants.ENDPOINT):
        # huggingface_hub retries a failed connection five times (about 23 s): no network is said at once
        raise AdvisorInputError("--model", f"not in the catalog or the local HF cache, and the Hub could not be "
                                f"reached ({endpoint or 'huggingface.co'}: no connection); give a local folder "
                                "holding its config.json", hub_id)
    try:
        path = Path(hf_hub_download(hub_id, "config.json", cache_dir=cache, endpoint=endpoint))
    except LocalEntryNotFoundError as e:  # no network (an EntryNotFoundError too: before it)
        raise AdvisorInputError("--model", f"not in the catalog or the local HF cache, and the Hub could not be "
                                f"reached ({endpoint or 'huggingface.co'}); give a local folder holding its "
                                "config.json", hub_id) from e
    except GatedRepoError as e:
        raise AdvisorInputError("--model", "the model is gated on the Hub: accept its license there and log in "
                                "(huggingface-cli login), or give a local folder holding its config.json",
                                hub_id) from e
    except RepositoryNotFoundError as e:
        raise AdvisorInputError("--model", "unknown model: not in the catalog, and the Hub has no such repository "
                                f"({endpoint or 'huggingface.co'})", hub_id) from e
    except EntryNotFoundError as e:
        raise AdvisorInputError("--model", "the Hub repository has no config.json", hub_id) from e
    except (HfHubHTTPError, OSError) as e:
        raise AdvisorInputError("--model", f"not in the catalog or the local HF cache, and the Hub could not be "
                                f"reached ({type(e).__name__}); give a local folder holding its config.json",
                                hub_id) from e
    for name in HUB_FILES[1:]:
        try:
            hf_hub_download(hub_id, name, cache_dir=cache, endpoint=endpoint)
        except (EntryNotFoundError, HfHubHTTPError):
            pass  # a text model has no processor
    return path.parent


def _reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``endpoint``'s host opens (its name resolves and something listens)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()
    except OSError:
        return False
    return True


PROCESSOR_FIELDS = ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels", "size",
                    "tokens_per_image", "longest_edge", "tile_size", "image_seq_len", "fps", "min_frames",
                    "max_frames", "max_image_size", "do_image_splitting")
"""The processor fields the token counts read (advisor.core.vision_tokens), as models.yaml's ``processor`` holds
them."""


def processor_in(folder: Path) -> dict | None:
    """models.yaml's ``processor`` of a hub snapshot: its image (and video) processor's class and fields; None for a
    text model."""
    out = {}
    for kind, name, key in (("image", "preprocessor_config.json", "image_processor_type"),
                            ("video", "video_preprocessor_config.json", "video_processor_type")):
        file = folder / name
        if not file.is_file():
            continue
        data = json.loads(file.read_text(encoding="utf-8"))
        if data.get(key):
            out[kind] = {"class": data[key], **{k: data[k] for k in PROCESSOR_FIELDS if k in data}}
    return out or None


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
    node_host_ram_bytes: int | None = None
    """RAM of the usual 8-card server node of this card (gpus.yaml ``node_host_ram_gib``; None: no usual node)."""
    node_source: str = ""
    """Where the node's RAM comes from."""

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
        node_host_ram_bytes=int(entry["node_host_ram_gib"]) * 2**30 if entry.get("node_host_ram_gib") else None,
        node_source=entry.get("node_source", ""),
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
    """The catalog entry whose NVML name (its ``name``, or an alias where the name is shortened for tables)
    matches a detected GPU's name, if any."""
    lowered = nvml_name.lower()
    for key, entry in gpu_catalog().items():
        if lowered in (entry["name"].lower(), *(str(a).lower() for a in entry.get("aliases", []))):
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


def peft_moved_lora_names(model_type: str) -> frozenset[str]:
    """LoRA target names that peft moves from target_modules to the stacked experts and the router of
    ``model_type`` (architectures.yaml ``peft_moe_target_rewrite``; empty where peft rewrites nothing)."""
    rule = architecture_facts().get("peft_moe_target_rewrite") or {}
    for pattern, types in (rule.get("model_types") or {}).items():
        if model_type in types:
            return frozenset(rule["moved_names"][pattern])
    return frozenset()
