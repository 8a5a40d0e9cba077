"""Trainbook's library. The public API, for notebooks and scripts (everything else may move between releases):

    cfg = toolkit.load_config("demo", ["train.max_steps=200"])   # a built-in config or a YAML path, plus overrides
    handle = toolkit.start_run(cfg)                              # supervisor + training processes; handle.follow()
    handle = toolkit.resume("runs/demo-...")                     # from the newest valid checkpoint
    run = toolkit.open_run("runs/demo-...")                      # its status, events, checkpoints, config
    speed = toolkit.steady_state(toolkit.read_events(run, toolkit.TrainEvent))  # tokens/s, MFU after start-up
    ws = toolkit.open_workspace(); toolkit.register_data(ws, "corpus", "data/corpus.txt", "uri_file")
    toolkit.get_data(ws, "corpus:1").path; toolkit.register_pydoc(ws)  # a version; a built-in corpus
    result = toolkit.export_run(run.path); toolkit.register_model(ws, result.path)
    with toolkit.serve("demo") as endpoint: endpoint.request({"prompt": "def "})
    plan = toolkit.plan_job(cfg, compute="gpu", sku="Standard_NC24ads_A100_v4", instance_count=2)
    toolkit.write_job_plan(plan, "outputs/azure-plan")        # job.yaml, environment, submit.md: to review

Kept import-light: each name loads its module on first use, and heavy modules (torch, deepspeed, tensorboard,
azure.ai.ml) load inside the functions that need them, so ``import toolkit`` stays fast in a notebook kernel.
"""

__version__ = "0.1.0"

import importlib as _importlib

# public name -> "module:attribute" (the one list the README's table and the tests read). The guided notebooks
# import from here only (tests/unit/test_notebook_imports.py): when a module moves, its line here follows it.
# No name may be a subpackage's ("train", "data", ...): importing toolkit.train.trainer sets toolkit.train to
# the package.
PUBLIC_API = {
    "load_config": "toolkit.config:load",
    "start_run": "toolkit.runs.launch:start",
    "resume": "toolkit.runs.launch:resume",
    "open_run": "toolkit.rundir:RunDir",
    "list_runs": "toolkit.runs.run_index:list_runs",
    "default_runs_root": "toolkit.paths:runs_root",
    "read_events": "toolkit.events:read_events",
    "StatusEvent": "toolkit.events:StatusEvent",
    "TrainEvent": "toolkit.events:TrainEvent",
    "CheckpointEvent": "toolkit.events:CheckpointEvent",
    "CheckpointStore": "toolkit.checkpoint.store:CheckpointStore",
    "steady_state": "toolkit.train.metrics:steady_state",
    "start_tensorboard": "toolkit.runs.tensorboard:start_tensorboard",
    "advise_checkpoint_interval": "toolkit.checkpoint.interval_advisor:advise_for_run",
    "facts_table": "toolkit.resources.doctor:facts_table",
    "parse_param_count": "toolkit.resources.zero_stages:parse_count",
    "recommend_zero_stage": "toolkit.resources.zero_stages:recommend_stage",
    "predict_memory": "toolkit.resources.memory_model:predict_run",
    "compare_memory": "toolkit.resources.memory_model:compare_run",
    "write_recommended_config": "toolkit.azure.recommended_config:write_recommended_config",
    "open_workspace": "toolkit.catalogue.workspace:Workspace.open",
    "register_data": "toolkit.catalogue.data_assets:register",
    "get_data": "toolkit.catalogue.data_assets:get",
    "register_pydoc": "toolkit.data.builtin:register_pydoc",
    "register_stdlib": "toolkit.data.builtin:register_stdlib",
    "train_tokenizer": "toolkit.data.tokenizer_training:train_tokenizer",
    "load_tokenizer": "toolkit.data.tokenizers:load_tokenizer",
    "register_digits": "toolkit.data.builtin:register_digits",
    "load_mltable": "toolkit.catalogue.mltable:load_mltable",
    "export_run": "toolkit.deploy.export:export_run",
    "register_model": "toolkit.catalogue.model_registry:register_model",
    "token_bits": "toolkit.report.token_bits:token_bits",
    "evaluate_run": "toolkit.report.evaluation:evaluate_run",
    "token_bits_html": "toolkit.report.token_bits:token_bits_html",
    "serve": "toolkit.deploy.serving.endpoint:serve",
    "measure_endpoint": "toolkit.deploy.serving.load_test:measure_endpoint",
    "forecast": "toolkit.azure.forecast:forecast_sizes",
    "plan_job": "toolkit.azure.plan:build_plan",
    "write_job_plan": "toolkit.azure.plan:write_plan",
    "plan_deployment": "toolkit.azure.deploy_plan:build_deployment_plan",
}
__all__ = list(PUBLIC_API)


def __getattr__(name: str):
    if name not in PUBLIC_API:
        raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
    module, _, attribute = PUBLIC_API[name].partition(":")
    value = _importlib.import_module(module)
    for part in attribute.split("."):
        value = getattr(value, part)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__():
    return sorted([*globals(), *PUBLIC_API])
