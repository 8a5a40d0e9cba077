"""Pre-launch checks of the model a run will train, made by toolkit.runs.launch.start() before the run directory
exists: each refusal names the field, the value and what is allowed, and nothing is started or written.

    config = pin_model(config)      import paths, model.hf.source and model.init_from made absolute (a registered
                                    model becomes its snapshot folder): restarts and resumes never depend on the
                                    folder the run was started from, nor on a version registered later
    check_model(config)             the checks below; nothing for a built-in model without init_from or LoRA

The model is built once for the checks: the user's own module for real (its factory must run, and one forward on a
batch of the run's own data must give a loss under its adapter), any other on the meta device (shapes, no weights:
free at any size). Then every function of CHECKS runs as ``check(cfg, model)`` and raises ModelCheckError (or any
ValueError) with a message naming what is wrong. Another part adds its own with :func:`register_check`, e.g. a
tokenizer whose vocabulary does not fit the model's embedding. ``model`` may be on the meta device: read shapes and
config, not values.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable

from toolkit.errors import UserError, refused

BUILT_IN = ("gpt", "digits_mlp")


class ModelCheckError(UserError, ValueError):
    """A model the run could not train; the message names the field, the value and what is allowed."""


def needs_checks(cfg) -> bool:
    """Built-in models have nothing to check that the config's own validation missed, unless they start from
    pretrained weights, get adapters or read another tokenizer than bytes."""
    m = cfg.model
    return m.name not in BUILT_IN or bool(m.init_from) or m.lora.rank > 0 or cfg.data.tokenizer not in ("auto", "bytes")


@contextlib.contextmanager
def _refusals():
    """Every refusal as a ModelCheckError on one line: ModelImportError, PretrainedError, ExportError, ConfigError...
    already name their field; a user's or a library's message may span several lines, which the CLI prints as one."""
    try:
        yield
    except ValueError as exc:
        if type(exc) is ModelCheckError:
            raise
        raise ModelCheckError(_one_line(str(exc))) from None


def pin_model(cfg):
    """``cfg`` with everything that names a place made independent of the current folder (see the module doc)."""
    with _refusals():
        return _pinned(cfg)


def _pinned(cfg):
    m = cfg.model
    if m.name == "custom":
        from toolkit.train.models import custom

        m = custom.pin(m)
    if m.name == "hf" and m.hf.source:
        from toolkit.train.models import hf

        m = hf.pin(m)
    if m.init_from:
        from toolkit.catalogue.pretrained import pin_init_from

        m = dataclasses.replace(m, init_from=pin_init_from(m.init_from, cfg.data.workspace or None))
    return cfg if m is cfg.model else dataclasses.replace(cfg, model=m)


# --- the checks ---------------------------------------------------------------------------------------------------


def _is_meta(model) -> bool:
    return any(p.is_meta for p in model.parameters())


def forward_gives_loss(cfg, model) -> None:
    """The user's module: one forward, on two examples of the run's own data, gives a finite scalar loss under
    its adapter (model(**batch), or model.loss)."""
    if cfg.model.name != "custom" or _is_meta(model):
        return
    import torch

    from toolkit.data.corpus import load_corpus
    from toolkit.train.models import custom

    if not cfg.model.loss and type(model).__name__.endswith("ForCausalLM") and hasattr(model, "config"):
        # a transformers causal LM shifts its labels itself, and the batch's are already shifted: model(**batch)
        # would train every position on the token after next, with a finite, plausible loss
        raise ModelCheckError(
            _one_line(
                refused(
                    "model.factory",
                    f"{cfg.model.factory} returned a transformers {type(model).__name__}, whose own loss "
                    "shifts the already shifted labels",
                    "model.name=hf (model.hf.source: its save_pretrained folder), "
                    "or model.loss set to 'module:function' taking (model, batch)",
                )
            )
        )
    batch = load_corpus(cfg).batch("val", 2, torch.Generator().manual_seed(0))
    adapter = custom.loss_function(cfg.model)
    call = cfg.model.loss or "model(**batch)"
    try:
        with torch.no_grad():
            loss = adapter(model, batch)
    except custom.ModelImportError:
        raise
    except Exception as exc:  # the user's forward may raise anything
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in batch.items())
        raise ModelCheckError(
            _one_line(
                refused(
                    "model.loss" if cfg.model.loss else "model.factory",
                    f"{call} raised {type(exc).__name__}: {exc} on a batch of {shapes}",
                    "a model whose forward takes the batch's keys (toolkit.data.batch) and returns a loss, "
                    "or model.loss set to 'module:function' taking (model, batch)",
                )
            )
        ) from None
    if not torch.isfinite(loss):
        raise ModelCheckError(
            refused(
                "model.loss" if cfg.model.loss else "model.factory",
                f"{call} gave a loss of {loss.item()} on a first batch",
                "a finite loss",
            )
        )


def context_fits(cfg, model) -> None:
    if cfg.model.name == "hf":
        from toolkit.train.models import hf

        hf.check_context(cfg.model, model)


def pretrained_weights_fit(cfg, model) -> None:
    """model.init_from's tensors: every one of the model's, each of the same shape (read from the files' headers)."""
    if not cfg.model.init_from:
        return
    from toolkit.catalogue.pretrained import open_weights
    from toolkit.train.models.init_from import check_fits

    check_fits(model, open_weights(cfg.model.init_from).shapes(), cfg.model)


def lora_targets_exist(cfg, model) -> None:
    """model.lora.target_modules name modules peft can adapt, and peft accepts the configuration."""
    if not cfg.model.lora.rank:
        return
    from toolkit.train.models import lora

    lora.check_targets(model, cfg.model)
    try:
        # peft's own checks, on a copy: it adds the adapters in place, and the checks after this one see the model
        lora.wrap(copy.deepcopy(model), cfg.model)
    except ValueError as exc:
        raise ModelCheckError(
            _one_line(
                refused("model.lora", f"peft refuses it: {exc}", "a LoRA configuration peft accepts for this model")
            )
        ) from None


def activation_checkpointing_supported(cfg, model) -> None:
    """model.activation_checkpointing: a transformers architecture that supports it, or the user's module with its own
    gradient_checkpointing_enable() (the built-in GPT always can; digits_mlp is refused by the config)."""
    if not cfg.model.activation_checkpointing:
        return
    if cfg.model.name == "custom":
        from toolkit.train.models import custom

        custom.check_activation_checkpointing(cfg.model, model)
    elif cfg.model.name == "hf":
        from toolkit.train.models import hf

        hf.check_activation_checkpointing(cfg.model, model)


def tensor_parallel_fits(cfg, model) -> None:
    """engine.tensor_parallel: a transformers model whose architecture declares a plan, and head counts, widths and
    vocabulary the split divides (the built-in GPT's are the config's, checked with it)."""
    if cfg.engine.tensor_parallel > 1 and cfg.model.name == "hf":
        from toolkit.train import tensor_parallel

        tensor_parallel.hf_plan(model)
        tensor_parallel.check_divisible(model, cfg.engine.tensor_parallel)


def tokenizer_fits(cfg, model) -> None:
    """Every id the run's tokenizer can produce has a row in the model's input embedding (toolkit.data owns the
    tokenizer, and the message)."""
    from toolkit.data.tokenizers import check_tokenizer_fits

    check_tokenizer_fits(cfg, model)


CHECKS: list[Callable] = [
    forward_gives_loss,
    context_fits,
    pretrained_weights_fit,
    lora_targets_exist,
    activation_checkpointing_supported,
    tensor_parallel_fits,
    tokenizer_fits,
]


def register_check(check: Callable) -> Callable:
    """Add ``check(cfg, model) -> None`` to the pre-launch checks (usable as a decorator); it runs after the built-in
    ones, on every run that has checks (see :func:`needs_checks`)."""
    if check not in CHECKS:
        CHECKS.append(check)
    return check


def _one_line(message: str) -> str:
    """An error as the CLI prints it: one line (a user's or a library's exception may span several)."""
    return " ".join(message.split())


def _build_for_checks(cfg):
    """The model the checks look at: the user's module for real, any other on the meta device."""
    m = cfg.model
    if m.name == "custom":
        from toolkit.train.models import custom

        return custom.build(m)  # its own errors name model.factory
    if m.name == "hf":
        from toolkit.train.models import hf

        if m.hf.source:
            hf.check_source(m)
        else:
            hf.check_architecture(m)
        try:
            return hf.build_empty(m)
        except Exception as exc:  # transformers' own checks of a config (e.g. heads that do not divide the width)
            field = "model.hf.source" if m.hf.source else "model.hf.config"
            problem = f"transformers cannot build it ({type(exc).__name__}: {exc})"
            raise ModelCheckError(
                _one_line(
                    refused(
                        field,
                        problem,
                        "a configuration transformers can build (see the architecture's config documentation)",
                    )
                )
            ) from None
    import torch

    from toolkit.train.models import build_model

    with torch.device("meta"):
        return build_model(m)


def check_model(cfg) -> None:
    """Run every check on ``cfg`` (pinned: :func:`pin_model`); the first failure raises, its message on one line."""
    if not needs_checks(cfg):
        return
    with _refusals():
        model = _build_for_checks(cfg)
        for check in CHECKS:
            check(cfg, model)
