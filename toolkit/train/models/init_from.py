"""Start a model from pretrained weights (``model.init_from``), after it is built and before LoRA and the engine.

The same rule decides before launch (from the files' headers, against a model on the meta device) and in the
training process (against the loaded tensors): every tensor of the model must come from the file with its exact
shape, except aliases of a tensor that does (tied weights: lm_head = the embedding) and, for a sequence classifier
started from a language model, the head outside the base model (new: it keeps its fresh initialisation).
"""

from __future__ import annotations

from toolkit.catalogue.pretrained import PretrainedError, open_weights
from toolkit.errors import not_allowed, refused

SHOWN = 5  # names a message lists at most


def aliases(model) -> dict[str, set[str]]:
    """Each parameter name -> every name of the same parameter (tied weights share one object)."""
    groups: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), set()).add(name)
    return {name: group for group in groups.values() for name in group}


def _head_free(cfg, model):
    """A predicate: may this tensor name be absent from the file, or present in it only? Only a sequence
    classifier's head (names outside its base model), when it starts from a model with another head."""
    prefix = getattr(model, "base_model_prefix", "")
    if cfg.name != "hf" or cfg.hf.task != "sequence_classification" or not prefix:
        return lambda name: False
    return lambda name: not name.startswith(prefix + ".")


def check_fits(model, shapes: dict[str, tuple], cfg) -> None:
    """Refuse weights (``shapes``: tensor name -> shape) that do not fit ``model``, naming the first tensor."""
    mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    where = cfg.init_from
    for name, shape in mine.items():
        if name in shapes and tuple(shapes[name]) != shape:
            raise PretrainedError(
                not_allowed(
                    "model.init_from",
                    where,
                    f"weights of this architecture with these sizes (model.name={cfg.name!r})",
                    problem=f"does not fit: its tensor {name} has shape {list(shapes[name])}, this model's has "
                    f"{list(shape)}",
                )
            )
    if not set(mine) & set(shapes):
        raise PretrainedError(
            not_allowed(
                "model.init_from",
                where,
                f"weights saved from this kind of model (model.name={cfg.name!r})",
                problem=f"shares no tensor name with this model (there: {', '.join(sorted(shapes)[:3])}; here: "
                f"{', '.join(list(mine)[:3])})",
            )
        )
    tied, head = aliases(model), _head_free(cfg, model)
    missing = [n for n in mine if n not in shapes and not (tied.get(n, set()) & set(shapes)) and not head(n)]
    if missing:
        raise PretrainedError(
            not_allowed(
                "model.init_from",
                where,
                "weights holding every tensor of this model",
                problem=f"lacks {len(missing)} of this model's tensors, "
                f"first {missing[0]} (shape {list(mine[missing[0]])})"
                + (f"; also {', '.join(missing[1:SHOWN])}" if len(missing) > 1 else ""),
            )
        )
    extra = [n for n in shapes if n not in mine and not head(n)]
    if extra:
        raise PretrainedError(
            not_allowed(
                "model.init_from",
                where,
                "weights of this model only (another architecture or more layers?)",
                problem=f"holds {len(extra)} tensors this model does not have, first {extra[0]} (shape "
                f"{list(shapes[extra[0]])})",
            )
        )


def apply(model, cfg) -> dict:
    """Load ``cfg.init_from`` (a ModelConfig's, pinned at launch) into ``model`` in place; returns its lineage."""
    weights = open_weights(cfg.init_from)
    state = weights.load()
    check_fits(model, {k: tuple(v.shape) for k, v in state.items()}, cfg)
    mine = set(model.state_dict())
    result = model.load_state_dict({k: v for k, v in state.items() if k in mine}, strict=False)
    if result.unexpected_keys:  # check_fits refuses these first; a second guard costs nothing
        raise PretrainedError(
            refused("model.init_from", f"{cfg.init_from} holds {result.unexpected_keys[0]}", "the model's own tensors")
        )
    return {"init_from": cfg.init_from, **weights.lineage()}
