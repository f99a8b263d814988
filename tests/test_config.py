from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from rlanything.config import Config, ConfigError, build_config, flatten, load_config, save_config

REPO = Path(__file__).resolve().parents[1]


def test_every_shipped_config_loads():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        assert isinstance(load_config(path), Config), path


def test_round_trip(tmp_path):
    config = load_config(REPO / "configs" / "tiny.yaml", ["algo.lam=0.5", "policy.optim.lr=3e-4"])
    save_config(config, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == config
    assert again.algo.lam == 0.5 and again.policy.optim.lr == 3e-4
    assert again.digest() == config.digest()


def test_defaults_live_in_the_schema():
    config = build_config({})
    assert (config.algo.lam, config.algo.clip_eps, config.algo.kl_beta) == (1.0, 0.2, 0.01)
    assert config.algo.band == (0.2, 0.8)
    assert config.rm.judgments_per_step == 3 and config.rm.temperature == 0.8
    assert config.rm_model == config.policy.model  # RM defaults to the policy's base


def test_every_field_has_a_docstring():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                walk(field.annotation)

    walk(Config)


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"policy": {"optim": {"lrr": 0.1}}}))
    with pytest.raises(ConfigError, match=r"policy\.optim\.lrr"):
        load_config(path)


def test_unknown_section_via_override_is_named():
    with pytest.raises(ConfigError, match=r"polcy"):
        build_config({}, ["polcy.group_size=4"])


def test_bad_value_is_named_with_the_value():
    with pytest.raises(ConfigError, match=r"policy\.group_size.*'many'"):
        build_config({}, ["policy.group_size=many"])
    with pytest.raises(ConfigError, match=r"policy\.group_size"):
        build_config({}, ["policy.group_size=0"])
    with pytest.raises(ConfigError, match=r"rm\.verdict"):
        build_config({"rm": {"verdict": "loose"}})


def test_band_must_be_ordered():
    with pytest.raises(ConfigError, match=r"band"):
        build_config({}, ["algo.band=[0.9, 0.1]"])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="section.key=value"):
        build_config({}, ["algo.lam"])
    with pytest.raises(ConfigError, match="not a section"):
        build_config({}, ["algo.lam=1", "algo.lam.x=2"])


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")


def test_digest_ignores_iterations_only():
    base = build_config({})
    assert build_config({}, ["run.iterations=7"]).digest() == base.digest()
    assert build_config({}, ["algo.lam=0"]).digest() != base.digest()


def test_flatten_for_mlflow_params():
    flat = flatten(build_config({}).to_dict())
    assert flat["policy.optim.lr"] == 1e-5 and flat["algo.band"] == [0.2, 0.8]


def test_run_root_is_a_path_or_a_mounted_filesystem_url(tmp_path):
    """A file:// URL names the same folder as its path (same run, same digest); an object store
    is refused with the reason, not half-written to."""
    url = build_config({"run": {"root": f"file://{tmp_path}/runs"}})
    path = build_config({"run": {"root": f"{tmp_path}/runs"}})
    assert url.run.root == f"{tmp_path}/runs" and url.run_dir == path.run_dir == tmp_path / "runs" / "tiny"
    assert url.digest() == path.digest()
    assert url.mlflow_uri == f"sqlite:///{tmp_path}/runs/mlflow.db"
    with pytest.raises(ConfigError, match=r"run.root.*s3://.*shared filesystem mounted"):
        build_config({"run": {"root": "s3://bucket/runs"}})
