"""`storage.checkpoints.weights_digest`: what identifies a policy's weights for reusing its
held-out episodes (tests/flows/test_eval_reuse.py plays the real case)."""

import json
import shutil

from rlanything.storage.checkpoints import weights_digest


def make_folder(path, weights: bytes = b"\x00\x01" * 64, tokenizer: dict | None = None):
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(weights)
    (path / "config.json").write_text('{"hidden_size": 64}')
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer or {"model_max_length": 2048}))
    return path


def test_the_same_files_share_a_digest_and_one_changed_byte_does_not(tmp_path):
    one = make_folder(tmp_path / "one")
    copy = tmp_path / "copy"
    shutil.copytree(one, copy)
    (copy / "optimizer.pt").write_bytes(b"adam moments")  # the optimizer state decides nothing generated
    (copy / "deepspeed_state").mkdir()
    (copy / "deepspeed_state" / "zero.pt").write_bytes(b"shards")
    assert weights_digest(one) == weights_digest(copy) is not None
    changed = make_folder(tmp_path / "changed", weights=b"\x00\x01" * 63 + b"\x00\x02")
    assert weights_digest(changed) != weights_digest(one)
    (copy / "generation_config.json").write_text('{"eos_token_id": 2}')  # a file more: another model
    assert weights_digest(copy) != weights_digest(one)
    moved = make_folder(tmp_path / "moved")
    (moved / "config.json").rename(moved / "config2.json")  # the same bytes under another name
    assert weights_digest(moved) != weights_digest(one)


def test_the_tokenizers_padding_side_is_left_out_and_the_rest_of_its_config_kept(tmp_path):
    base = make_folder(tmp_path / "base")
    saved = make_folder(tmp_path / "saved", tokenizer={"padding_side": "left", "model_max_length": 2048})
    other = make_folder(tmp_path / "other", tokenizer={"model_max_length": 512})
    assert weights_digest(base) == weights_digest(saved) != weights_digest(other)


def test_no_folder_no_digest(tmp_path):
    assert weights_digest(tmp_path / "nowhere") is None
    (tmp_path / "file").write_text("x")
    assert weights_digest(tmp_path / "file") is None
