"""``trainbook config``: built-in and your own configs: show one resolved, with each field's doc."""

from __future__ import annotations

from toolkit.cli.common import add_set
from toolkit.cli.conventions import add_verb, add_verbs


def register(verbs) -> None:
    config = add_verb(
        verbs,
        "config",
        "built-in and your own configs: show one resolved, with each field's doc",
        ["trainbook config show demo", "trainbook config show llama --set train.batch_size=8"],
    )
    config_verbs = add_verbs(config, "config_verb")
    cshow = add_verb(
        config_verbs,
        "show",
        "the resolved config (built-in defaults, the file, then --set), each field with its value and doc",
        ["trainbook config show demo --set engine.nproc=2"],
    )
    cshow.add_argument("config", help="a YAML file, or the name of a built-in config")
    add_set(cshow)
    cshow.set_defaults(func=cmd_config_show)


def cmd_config_show(args) -> int:
    from toolkit import config as config_mod

    print(config_mod.commented_yaml(config_mod.load(args.config, args.set or [])), end="")
    return 0
