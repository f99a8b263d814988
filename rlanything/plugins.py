"""Importing a user's class named "package.module:ClassName" (plug-in environments).

Kept apart from `envs` so that the config can validate a plug-in's options without importing
any of our environments: this module imports nothing of ours.
"""

from __future__ import annotations

import importlib

ENVIRONMENT_MEMBERS = (
    "system_prompt",
    "judge_hint",
    "reset",
    "step",
    "outcome",
    "close",
    "initial_specs",
    "validate_spec",
    "rewrite_instructions",
    "parse_rewrite",
    "rule_rewrite",
)
"""What a class must define to be an `rlanything.envs.base.Environment` (checked when a plug-in
environment is loaded, by the config and by `envs.base.env_class`)."""


def environment_class(kind: str, builtins: dict[str, str]) -> type:
    """An environment kind -> its class: a built-in name (`builtins`: name -> "module:Class"),
    or a plug-in "package.module:ClassName" that defines every `ENVIRONMENT_MEMBERS`."""
    if kind not in builtins and ":" not in kind:
        raise ValueError(
            f"unknown environment kind {kind!r}: use one of {list(builtins)} or a plug-in "
            "class as 'package.module:ClassName'"
        )
    cls = import_class(builtins.get(kind, kind), "environment")
    missing = [member for member in ENVIRONMENT_MEMBERS if not hasattr(cls, member)]
    if missing:
        raise ValueError(
            f"environment {kind!r} does not implement rlanything.envs.base.Environment: missing {', '.join(missing)}"
        )
    return cls


def import_class(ref: str, what: str) -> type:
    """ "package.module:ClassName" -> the class; ValueError saying what is wrong.

    >>> import_class("collections:OrderedDict", "example").__name__
    'OrderedDict'
    """
    module_name, colon, name = ref.partition(":")
    if not colon or not module_name or not name:
        raise ValueError(f"{what} {ref!r}: expected 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"{what} {ref!r}: cannot import {module_name!r} ({err}); is its package "
            "installed, or its folder on PYTHONPATH?"
        ) from err
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{what} {ref!r}: module {module_name!r} has no class {name!r}")
    return cls
