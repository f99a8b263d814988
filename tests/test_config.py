import logging
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from rlanything.config import (
    Config,
    ConfigError,
    build_config,
    flatten,
    load_config,
    save_config,
)
from rlanything.environment import ENV_KINDS, TextWorldOptions

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "custom_env"


def test_every_shipped_config_loads(monkeypatch, caplog):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the plug-in example's package
    paths = sorted((REPO / "configs").rglob("*.yaml")) + sorted((REPO / "examples").rglob("*.yaml"))
    paths = [p for p in paths if "accelerate" not in p.parts]  # accelerate's own config files
    assert len(paths) >= 9
    with caplog.at_level(logging.WARNING, logger="rlanything.config"):
        for path in paths:
            assert isinstance(load_config(path), Config), path
    assert not caplog.records, "a shipped config uses the old layout"


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
    for entry in ENV_KINDS.values():  # env.options is typed by env.kind
        walk(entry.options)


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


# ---------------------------------------------------------------- model sections


def test_policy_rm_and_env_model_share_one_section_type():
    from rlanything.config import ModelConfig

    config = build_config({})
    for section in (config.policy, config.rm, config.env_model):
        assert isinstance(section, ModelConfig)
        assert section.device == "auto" and section.engine == "transformers"
    assert (config.policy.temperature, config.rm.temperature, config.env_model.temperature) == (1.0, 0.8, 0.7)
    assert config.env_model.max_new_tokens == 160 and config.policy.max_new_tokens == 64


def test_env_model_defaults_to_the_policy_base_and_its_engine_settings():
    policy = {
        "model": "builtin:tiny-random",
        "engine": "transformers",
        "device": "cpu",
        "precision": "bf16",
        "batch_size": 5,
        "kv_reuse_gb": 0.5,
    }
    config = build_config({"policy": policy})
    env_model = config.env_model
    assert (env_model.model, env_model.device, env_model.precision, env_model.batch_size, env_model.kv_reuse_gb) == (
        "builtin:tiny-random",
        "cpu",
        "bf16",
        5,
        0.5,
    )
    assert env_model.temperature == 0.7  # its own sampling defaults, not the policy's
    own = build_config({"policy": policy, "env_model": {"precision": "fp32", "batch_size": 3, "model": "/models/x"}})
    assert (own.env_model.precision, own.env_model.batch_size, own.env_model.model) == ("fp32", 3, "/models/x")
    assert own.env_model.device == "cpu"  # still the policy's where left out
    assert config.rm_model == "builtin:tiny-random" and config.rm.precision == "auto"  # the RM keeps its own


def test_env_model_round_trips_resolved(tmp_path):
    config = build_config({"policy": {"precision": "bf16"}})
    save_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["env_model"]["precision"] == "bf16"  # the file says what runs
    again = load_config(tmp_path / "config.yaml")
    assert again == config and again.digest() == config.digest()


def test_device_is_checked():
    assert build_config({"rm": {"device": "cuda:1"}}).rm.device == "cuda:1"
    for bad in ("gpu", "cuda:x", "cuda:"):
        with pytest.raises(ConfigError, match=r"policy\.device"):
            build_config({"policy": {"device": bad}})


def test_env_model_with_vllm_needs_top_p_1():
    with pytest.raises(ConfigError, match=r"env_model.top_p"):
        build_config({"env_model": {"engine": "vllm", "top_p": 0.9}})


NO_RM = ["rm.judgments_per_step=0", "algo.lam=0", "rm.optim.frozen=true", "adapt.enabled=false"]


def test_no_rm_in_the_loop_needs_everything_that_reads_judgments_off():
    assert build_config({}, NO_RM).rm.judgments_per_step == 0
    with pytest.raises(ConfigError, match=r"judgments_per_step 0 .* needs algo.lam: 0.*; adapt.enabled: false"):
        build_config({}, ["rm.judgments_per_step=0", "rm.optim.frozen=true"])  # lam 1, adapt on
    with pytest.raises(ConfigError, match=r"needs rm.optim.frozen: true \(the RM trains on its judgments\) \(got"):
        build_config({}, [*NO_RM, "rm.optim.frozen=false"])
    with pytest.raises(ConfigError, match=r"rm.judgments_per_step"):
        build_config({}, ["rm.judgments_per_step=-1"])


def test_rm_balance_needs_a_judge():
    assert build_config({}, ["algo.rm_balance=true"]).algo.rm_balance
    with pytest.raises(ConfigError, match=r"algo.rm_balance reweights judgments: it needs rm.role judge"):
        build_config({"env": {"kind": "coding"}}, ["algo.rm_balance=true", "rm.role=unit_tests"])
    assert build_config({}, ["algo.rm_balance=true", "algo.rm_target=progress"]).algo.rm_target == "progress"
    with pytest.raises(ConfigError, match=r"algo.rm_advantage reward pays judgments: it needs rm.role judge"):
        build_config({"env": {"kind": "coding"}}, ["algo.rm_advantage=reward", "rm.role=unit_tests"])


def test_leaving_the_forced_verdict_tokens_untrained_needs_the_constrained_verdict():
    assert not build_config({}, ["rm.verdict=constrained", "rm.train_forced_tokens=false"]).rm.train_forced_tokens
    with pytest.raises(ConfigError, match="rm.train_forced_tokens false .* needs rm.verdict constrained"):
        build_config({}, ["rm.verdict=free", "rm.train_forced_tokens=false"])


def test_a_direct_verdict_needs_the_constrained_mode_of_a_judge():
    config = build_config({}, ["rm.max_new_tokens=0", "rm.verdict=constrained"])
    assert config.rm.max_new_tokens == 0 and config.policy.max_new_tokens == 64  # the RM's alone
    with pytest.raises(ConfigError, match=r"rm.max_new_tokens 0 .* needs rm.verdict constrained"):
        build_config({}, ["rm.max_new_tokens=0"])  # free: the RM must write its own box
    with pytest.raises(ConfigError, match=r"max_new_tokens"):
        build_config({}, ["policy.max_new_tokens=0"])


# ---------------------------------------------------------------- environment options by kind


def test_options_are_validated_by_the_model_of_the_kind_only():
    config = build_config({"env": {"kind": "textworld", "options": {"game": "tw-cooking"}}})
    assert isinstance(config.env.options, TextWorldOptions)
    assert config.env.options.game == "tw-cooking" and config.env.options.tw_make == TextWorldOptions().tw_make
    for kind, entry in ENV_KINDS.items():  # no options: that kind's defaults
        assert build_config({"env": {"kind": kind}}).env.options == entry.options()
    with pytest.raises(ConfigError, match=r"env\.options\.dataset: Extra inputs"):
        build_config({"env": {"kind": "textworld", "options": {"dataset": "basic_arithmetic"}}})
    with pytest.raises(ConfigError, match=r"env\.options\.pool_size.*'many'"):
        build_config({"env": {"kind": "miniwob"}}, ["env.options.pool_size=many"])
    with pytest.raises(ConfigError, match=r"env\.kind.*unknown environment kind 'webshop'"):
        build_config({"env": {"kind": "webshop"}})


def test_options_dump_and_digest_follow_the_kind():
    arith = build_config({}, ["env.options.dataset_config={max_terms: 2}"])
    assert arith.to_dict()["env"]["options"] == {
        "dataset": "basic_arithmetic",
        "dataset_config": {"max_terms": 2},
        "worked_example": False,
    }
    assert arith.digest() != build_config({}).digest()
    assert flatten(arith.to_dict())["env.options.dataset_config.max_terms"] == 2


# ---------------------------------------------------------------- the old layout


def test_old_keys_are_migrated_with_a_warning_that_says_what_changed(caplog):
    old = {
        "env": {
            "kind": "textworld",
            "dataset": "basic_arithmetic",
            "dataset_config": {},
            "textworld": {"game": "custom", "options": {"world_size": 1}, "games_dir": "/tmp/g"},
            "miniwob": {"pool_size": 2},
        },
        "adapt": {"model": "builtin:tiny-random", "max_new_tokens": 99, "temperature": 0.5, "rewriter": "rule"},
    }
    with caplog.at_level(logging.WARNING, logger="rlanything.config"):
        config = build_config(old)
    assert config.env.options == TextWorldOptions(game="custom", tw_make={"world_size": 1}, games_dir="/tmp/g")
    assert (config.env_model.model, config.env_model.max_new_tokens, config.env_model.temperature) == (
        "builtin:tiny-random",
        99,
        0.5,
    )
    assert config.adapt.rewriter == "rule"
    text = caplog.text
    for line in (
        "env.textworld.options -> env.options.tw_make",
        "env.textworld.game -> env.options.game",
        "adapt.model -> env_model.model",
        "adapt.max_new_tokens -> env_model.max_new_tokens",
        "env.dataset dropped",
        "env.miniwob dropped (options of kind miniwob; env.kind is textworld)",
    ):
        assert line in text, line


def test_old_reasoning_gym_keys_and_overrides_move_to_env_options(caplog):
    with caplog.at_level(logging.WARNING, logger="rlanything.config"):
        config = build_config({"env": {"dataset": "leg_counting"}}, ["env.dataset_config.max_animals=3"])
    assert config.env.options.dataset == "leg_counting" and config.env.options.dataset_config == {"max_animals": 3}
    assert "env.dataset -> env.options.dataset" in caplog.text
    # an old key beside its new place: refused, naming both
    with pytest.raises(ConfigError, match=r"env.dataset_config moved to env.options.dataset_config.*keep only"):
        load_config(REPO / "configs" / "tiny.yaml", ["env.dataset_config.max_terms=3"])


def test_a_saved_config_of_the_old_layout_resumes(tmp_path):
    """A run folder's config.yaml from before the change names every kind's section."""
    old = build_config({}).to_dict()
    old["env"].pop("options")
    old["env"].update(dataset="basic_arithmetic", dataset_config={"max_terms": 2})
    old["env"].update({kind: {} for kind in ENV_KINDS if kind != "reasoning_gym"})
    old["adapt"].update(model=None, max_new_tokens=160, temperature=0.7)
    del old["env_model"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    config = load_config(tmp_path / "config.yaml")
    assert config.env.options.dataset_config == {"max_terms": 2}
    assert config.env_model.model == config.policy.model


def test_unknown_keys_stay_errors_in_both_layouts():
    with pytest.raises(ConfigError, match=r"env\.datset"):
        build_config({"env": {"datset": "x"}})
    with pytest.raises(ConfigError, match=r"env\.options\.datset"):
        build_config({"env": {"options": {"datset": "x"}}})
    with pytest.raises(ConfigError, match=r"adapt\.modle"):
        build_config({"adapt": {"modle": "x"}})


def test_top_layer_training_is_refused_with_lora():
    assert build_config({"rm": {"optim": {"train_top_layers": 4}}}).rm.optim.train_top_layers == 4
    with pytest.raises(ConfigError, match="policy.optim.train_top_layers trains whole layers: not with policy.lora"):
        build_config({"policy": {"optim": {"train_top_layers": 4}, "lora": {"enabled": True}}})


def test_expected_verdicts_need_a_direct_verdict_paid_per_unit_of_s():
    ok = {
        "rm": {"verdict": "constrained", "max_new_tokens": 0, "train_forced_tokens": False},
        "algo": {"rm_verdicts": "expected", "rm_advantage": "reward"},
    }
    assert build_config(ok).algo.rm_verdicts == "expected"
    assert build_config({}).algo.rm_verdicts == "drawn"  # the paper's
    # several mini-batches deal whole steps (Sample.unit): no longer refused
    several = {**ok, "rm": {**ok["rm"], "optim": {"updates_per_iteration": 4}}}
    assert build_config(several).rm.optim.updates_per_iteration == 4
    for key, value, named in (
        ("max_new_tokens", 8, "rm.max_new_tokens: 0"),
        ("train_forced_tokens", True, "rm.train_forced_tokens: false"),
        ("replay_iterations", 2, "rm.replay_iterations: 0"),
    ):
        with pytest.raises(ConfigError, match=f"algo.rm_verdicts expected needs .*{named}"):
            build_config({**ok, "rm": {**ok["rm"], key: value}})
    with pytest.raises(ConfigError, match="algo.rm_advantage: reward"):
        build_config({**ok, "algo": {"rm_verdicts": "expected"}})
    # the stratified deal reads the expected verdicts' payoff signs
    assert build_config({**ok, "algo": {**ok["algo"], "rm_stratify": True}}).algo.rm_stratify
    with pytest.raises(ConfigError, match="algo.rm_stratify .* needs algo.rm_verdicts expected"):
        build_config({"algo": {"rm_stratify": True}})
