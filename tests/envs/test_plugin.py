"""Plug-in environments: `env.kind: "package.module:ClassName"` with options validated by the
class's own pydantic model; the example package in examples/custom_env."""

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from rlanything.config import ConfigError, build_config
from rlanything.environment import ENV_KINDS, NoOptions
from rlanything.envs.base import Environment, env_class, initial_specs, make_env, optional, replayable, screenshot

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env"
KIND = "my_env_pkg.addition:AdditionEnv"


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))


class _Base:
    system_prompt, judge_hint = "Say hi.", "Hi is good."

    def __init__(self, config):
        self.config = config

    reset = step = outcome = close = lambda *a: None
    initial_specs = validate_spec = rewrite_instructions = parse_rewrite = rule_rewrite = staticmethod(lambda *a: None)


class NoOptionsEnv(_Base):
    """A plug-in without an Options model: it takes no options."""


class LaxOptions(BaseModel):  # extra keys not forbidden by the plug-in: refused all the same
    model_config = ConfigDict(frozen=True)
    size: int = 1


class LaxEnv(_Base):
    Options = LaxOptions


class HalfEnv:
    """Misses most of the protocol."""

    system_prompt = "x"

    def reset(self, spec):
        return ""


def test_the_example_plugin_loads_and_plays(example_on_path):
    config = build_config({"env": {"kind": KIND, "num_problems": 3, "options": {"low": 10, "high": 20}}}).env
    assert type(config.options).__name__ == "AdditionOptions" and config.options.high == 20
    specs = initial_specs(config, seed=0)
    assert len(specs) == 3 and all(10 <= s["a"] <= 20 and 10 <= s["b"] <= 20 for s in specs)
    env = make_env(config)
    assert env.reset({"a": 12, "b": 30}) == "What is 12 + 30?"
    assert env.step("42").done and env.outcome() == 1
    env.reset({"a": 12, "b": 30})
    env.step("41")
    assert env.outcome() == -1
    cls = env_class(KIND)
    easier = cls.parse_rewrite({"a": 12, "b": 30}, cls.rule_rewrite({"a": 12, "b": 30}, "easier"))
    assert easier == {"a": 1, "b": 3}
    with pytest.raises(ValueError, match="a must be an integer"):
        cls.validate_spec(config, {"a": -1, "b": 3})


def test_plugin_options_errors_name_the_key(example_on_path):
    with pytest.raises(ConfigError, match=r"env\.options\.hihg: Extra inputs are not permitted"):
        build_config({"env": {"kind": KIND, "options": {"hihg": 3}}})
    with pytest.raises(ConfigError, match=r"env\.options\.low: .*greater than or equal to 0.*-4"):
        build_config({"env": {"kind": KIND, "options": {"low": -4}}})
    lax = f"{__name__}:LaxEnv"
    assert build_config({"env": {"kind": lax, "options": {"size": 3}}}).env.options.size == 3
    with pytest.raises(ConfigError, match=r"env\.options.*unknown option\(s\) \['colour'\].*its options: \['size'\]"):
        build_config({"env": {"kind": lax, "options": {"colour": 3}}})


def test_a_plugin_without_options_takes_none():
    kind = f"{__name__}:NoOptionsEnv"
    assert build_config({"env": {"kind": kind}}).env.options == NoOptions()
    with pytest.raises(ConfigError, match=r"env\.options\.size: Extra inputs"):
        build_config({"env": {"kind": kind, "options": {"size": 1}}})


def test_bad_plugin_kinds_are_refused_with_the_reason():
    cases = {
        "no_such_pkg.envs:Env": r"cannot import 'no_such_pkg.envs'.*PYTHONPATH",
        f"{__name__}:Missing": r"has no class 'Missing'",
        f"{__name__}:HalfEnv": r"does not implement .*Environment: missing judge_hint, step, outcome, close",
        "my_env_pkg": r"unknown environment kind 'my_env_pkg'",
    }
    for kind, message in cases.items():
        with pytest.raises(ConfigError, match=r"env\.kind: .*" + message):
            build_config({"env": {"kind": kind}})


def test_every_builtin_kind_has_a_class_and_an_options_model():
    for kind, entry in ENV_KINDS.items():
        assert issubclass(entry.options, BaseModel) and entry.options.model_config["extra"] == "forbid", kind
        cls = env_class(kind)  # imports the class (and its libraries)
        assert entry.env_class.endswith(":" + cls.__name__) and Environment in cls.__mro__, kind


def test_a_plugin_may_leave_the_optional_members_out(example_on_path):
    cls = env_class(KIND)  # AdditionEnv does not subclass Environment
    env = cls(build_config({"env": {"kind": KIND}}).env)
    assert Environment not in cls.__mro__
    assert replayable(cls) and screenshot(env) is None and optional(env, "example") is None
    assert optional(cls, "step_labels")(None, {"a": 1, "b": 2}, ["3"]) is None
    assert optional(cls, "heldout_specs") is None and optional(env, "test_results") is None
    with pytest.raises(AttributeError, match="not an optional member"):
        optional(env, "reset")
