"""Importing a user's class named "package.module:ClassName" (plug-in environments), and the
class of any environment kind, checked against the `Environment` Protocol.

Kept apart from `envs` so that the config can validate a plug-in's options without importing
any of our environments: this module imports nothing of ours but rlanything/environment.py
(the Protocol and the built-in kinds, pydantic only).
"""

from __future__ import annotations

import importlib

from rlanything.environment import ENV_KINDS, REQUIRED_MEMBERS


def environment_class(kind: str) -> type:
    """An environment kind -> its class: a built-in name (`ENV_KINDS`), or a plug-in
    "package.module:ClassName" that defines every one of the Protocol's `REQUIRED_MEMBERS`."""
    if kind not in ENV_KINDS and ":" not in kind:
        raise ValueError(
            f"unknown environment kind {kind!r}: use one of {list(ENV_KINDS)} or a plug-in "
            "class as 'package.module:ClassName'"
        )
    cls = import_class(ENV_KINDS[kind].env_class if kind in ENV_KINDS else kind, "environment")
    missing = [member for member in REQUIRED_MEMBERS if not hasattr(cls, member)]
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
