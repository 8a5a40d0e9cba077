"""``trainbook azure ...``: plan an Azure ML job into a folder of YAML files, submit a plan to a workspace; plan
an online endpoint for an exported model, deploy it.

Only argparse at import time: the parser is built on every CLI call, azure.ai.ml loads when a verb runs.
"""

from __future__ import annotations

import sys

from toolkit.cli.conventions import add_verb, add_verbs


def _config_ref(args):
    """The workspace of --workspace-config, if given: plans only name it in their instructions."""
    from toolkit.azure.connection import workspace_ref

    return workspace_ref(args.workspace_config) if args.workspace_config else None


def _print_plan(plan, out, readme: str) -> int:
    print(plan.summary())
    print(f"{'plan':<12} {out / readme}")
    return 0


def _in_workspace(args, action, interrupted: str) -> int:
    """``action(ref)`` on the workspace the flags name; Ctrl-C says what goes on in Azure ML (exit 130)."""
    from toolkit.azure.connection import workspace_ref

    ref = workspace_ref(
        args.workspace_config,
        subscription_id=args.subscription,
        resource_group=args.resource_group,
        workspace_name=args.workspace_name,
    )
    try:
        action(ref)
    except KeyboardInterrupt:
        print(f"interrupted: {interrupted}", file=sys.stderr)
        return 130
    return 0


def _cmd_plan(args) -> int:
    from toolkit import config as config_mod
    from toolkit.azure.plan import build_plan, write_plan

    cfg = config_mod.load(args.config, list(args.set or []))
    plan = build_plan(
        cfg,
        compute=args.compute,
        sku=args.sku,
        instance_count=args.instance_count,
        gpus_per_node=args.gpus_per_node,
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        idle_seconds=args.idle_seconds,
        low_priority=args.low_priority,
        image=args.image,
        workspace=_config_ref(args),
        conda_file=args.conda_file,
        run_name=args.run_name,
        datastore=args.datastore,
        run_storage=args.run_storage,
        max_restarts=args.max_restarts,
        services=args.services,
        ssh_public_key=args.ssh_public_key,
        elastic_min_nodes=args.elastic_min_nodes,
    )
    if args.forecast_tokens:  # the job's expected time, cost and failures, in submit.md for its reviewer
        from toolkit.azure import forecast as fc

        tokens = fc.Sourced(fc.count("--forecast-tokens", args.forecast_tokens), "given")
        plan.forecast = fc.forecast_config(cfg, plan.sku.name, args.instance_count, tokens)
    return _print_plan(plan, write_plan(plan, args.out), "submit.md")


def _cmd_submit(args) -> int:
    from toolkit.azure.submit import submit

    return _in_workspace(
        args,
        lambda ref: submit(args.plan_dir, ref, stream=not args.no_stream),
        "the job keeps running in Azure ML (see its studio page)",
    )


def _add_plan(verbs) -> None:
    from toolkit.azure.entities import DEFAULT_DATASTORE, SERVICES
    from toolkit.azure.plan import DEFAULT_IDLE_SECONDS, DEFAULT_MAX_RESTARTS

    plan = add_verb(
        verbs,
        "plan",
        "validate and write compute/environment/data/job YAML and submit.md",
        [
            "trainbook azure plan demo --compute gpu-a100 --sku Standard_NC24ads_A100_v4 --instance-count 2 "
            "--out plans/demo"
        ],
    )
    plan.add_argument("config", help="a YAML file, or the name of a built-in config (tiny, demo, llama, ...)")
    plan.add_argument("--compute", required=True, help="AmlCompute cluster name (3-24 letters, digits, '-')")
    plan.add_argument("--sku", required=True, help="VM size of one node, e.g. Standard_NC24ads_A100_v4")
    plan.add_argument("--instance-count", type=int, required=True, help="nodes the job runs on")
    plan.add_argument(
        "--gpus-per-node", type=int, help="processes per node on a GPU size, 1 to its GPU count (default: all its GPUs)"
    )
    plan.add_argument("--min-nodes", type=int, default=0, help="nodes kept when idle (default: 0)")
    plan.add_argument("--max-nodes", type=int, help="cluster size limit (default: --instance-count)")
    plan.add_argument(
        "--idle-seconds",
        type=int,
        default=DEFAULT_IDLE_SECONDS,
        help=f"idle time before a node is released (default: {DEFAULT_IDLE_SECONDS})",
    )
    plan.add_argument("--low-priority", action="store_true", help="low-priority nodes: cheaper, can be preempted")
    plan.add_argument(
        "--elastic-min-nodes",
        type=int,
        help="an elastic job (the config's data.sampling: epochs): train once this many of the nodes are up, take in "
        "the rest as they come, go on without a lost one (default: a fixed job)",
    )
    plan.add_argument(
        "--run-name",
        help="the run's folder on the datastore (default: the config's name); planning "
        "and submitting again under the same name resumes the run",
    )
    plan.add_argument(
        "--datastore", default=DEFAULT_DATASTORE, help=f"datastore that holds the runs (default: {DEFAULT_DATASTORE})"
    )
    plan.add_argument(
        "--run-storage",
        default="datastore",
        help="datastore (default: shared by the nodes, survives the job) or local (outputs/run on one "
        "node, uploaded at the end: a quick single-node try)",
    )
    plan.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help=f"restarts of the ranks inside the job, from the last checkpoint (default: {DEFAULT_MAX_RESTARTS})",
    )
    plan.add_argument(
        "--services",
        default="tensorboard",
        metavar="NAME[,NAME...]",
        help=f"interactive job services: {', '.join(SERVICES)} (default: tensorboard; '' for none)",
    )
    plan.add_argument(
        "--ssh-public-key",
        metavar="FILE",
        help="public key file for the ssh service, e.g. ~/.ssh/id_ed25519.pub (never the private key)",
    )
    plan.add_argument("--image", help="base image (default: the current ACPT curated image)")
    plan.add_argument("--conda-file", help="conda environment file (default: the project's environment.yml)")
    plan.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override one config field (repeatable), e.g. --set engine.name=deepspeed",
    )
    plan.add_argument(
        "--workspace-config",
        metavar="CONFIG_JSON",
        help="Azure ML config.json: fills resource group and workspace into submit.md",
    )
    plan.add_argument(
        "--forecast-tokens",
        metavar="TOKENS",
        help="forecast the job's time, cost and failures for this token budget (300B) into submit.md",
    )
    plan.add_argument("--out", required=True, help="plan folder to write (an earlier plan there is replaced)")
    plan.set_defaults(func=_cmd_plan)


def _add_submit(verbs) -> None:
    submit = add_verb(
        verbs,
        "submit",
        "create a plan's compute, environment, data and job; stream its log",
        ["trainbook azure submit plans/demo --workspace-config config.json"],
    )
    submit.add_argument("plan_dir", help="a folder written by `trainbook azure plan`")
    _add_workspace_flags(submit)
    submit.add_argument("--no-stream", action="store_true", help="return once the job is submitted")
    submit.set_defaults(func=_cmd_submit)


def _cmd_deploy_plan(args) -> int:
    from toolkit.azure.deploy_plan import build_deployment_plan, write_deployment_plan

    plan = build_deployment_plan(
        args.model,
        endpoint=args.endpoint,
        sku=args.sku,
        instance_count=args.instance_count,
        deployment=args.deployment,
        runtime=args.runtime,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        image=args.image,
        workspace=_config_ref(args),
    )
    return _print_plan(plan, write_deployment_plan(plan, args.out), "deploy.md")


def _cmd_deploy(args) -> int:
    from toolkit.azure.deploy import credentials_hint, deploy

    def deploy_and_report(ref) -> None:
        endpoint = deploy(args.plan_dir, ref)
        print(f"scoring uri: {endpoint.scoring_uri}")
        print(f"keys: {credentials_hint(endpoint.name, ref)}")

    return _in_workspace(
        args,
        deploy_and_report,
        "Azure ML goes on creating what it started; see `az ml online-deployment list -e ENDPOINT`",
    )


def _add_workspace_flags(parser) -> None:
    parser.add_argument(
        "--workspace-config",
        metavar="CONFIG_JSON",
        help="Azure ML config.json (default: ./config.json, then ./.azureml/config.json)",
    )
    parser.add_argument("--subscription", help="subscription id (with --resource-group and --workspace-name)")
    parser.add_argument("--resource-group", help="resource group (with --subscription)")
    parser.add_argument("--workspace-name", help="Azure ML workspace name (with --subscription)")


def _add_deploy_plan(verbs) -> None:
    from toolkit.deploy.serving.options import MAX_BATCH, MAX_WAIT_MS

    plan = add_verb(
        verbs,
        "deploy-plan",
        "validate and write endpoint/deployment YAML and deploy.md for an exported model",
        ["trainbook azure deploy-plan demo:1 --endpoint demo-ep --sku Standard_DS3_v2 --out plans/demo-ep"],
    )
    plan.add_argument("model", help="an exported model folder, or a registered model name[:version]")
    plan.add_argument("--endpoint", required=True, help="online endpoint name (3-32 letters, digits, '-')")
    plan.add_argument("--sku", required=True, help="VM size of one instance, e.g. Standard_DS3_v2")
    plan.add_argument("--instance-count", type=int, default=1, help="instances (default: 1; 3 for production)")
    plan.add_argument("--deployment", default="blue", help="deployment name (default: blue)")
    plan.add_argument(
        "--runtime",
        help="onnx (model.onnx) or torch (model.safetensors); default: torch for a "
        "transformers model (it generates with a KV cache), onnx for the built-ins",
    )
    plan.add_argument(
        "--max-batch", type=int, default=16, help=f"requests batched together, 1 to {MAX_BATCH} (default: 16)"
    )
    plan.add_argument(
        "--max-wait-ms",
        type=int,
        default=5,
        help=f"how long a request waits for its batch to fill, 0 to {MAX_WAIT_MS} ms (default: 5)",
    )
    plan.add_argument("--image", help="base image (default: Azure ML's minimal CPU inference image; ACPT on GPUs)")
    plan.add_argument(
        "--workspace-config",
        metavar="CONFIG_JSON",
        help="Azure ML config.json: fills resource group and workspace into deploy.md",
    )
    plan.add_argument("--out", required=True, help="plan folder to write (an earlier deployment plan is replaced)")
    plan.set_defaults(func=_cmd_deploy_plan)


def _add_deploy(verbs) -> None:
    deploy = add_verb(
        verbs,
        "deploy",
        "create a deployment plan's endpoint and deployment, route all traffic to it, print the scoring URI",
        ["trainbook azure deploy plans/demo-ep --workspace-config config.json"],
    )
    deploy.add_argument("plan_dir", help="a folder written by `trainbook azure deploy-plan`")
    _add_workspace_flags(deploy)
    deploy.set_defaults(func=_cmd_deploy)


AZURE_VERBS = [_add_plan, _add_submit, _add_deploy_plan, _add_deploy]
"""Each adds one ``trainbook azure`` sub-verb; deployment verbs append theirs here."""


def add_azure_verbs(verbs) -> None:
    """Add ``azure`` and its sub-verbs to the top-level subparsers of the trainbook CLI."""
    azure = add_verb(
        verbs,
        "azure",
        "Azure ML: plan a training job or an online endpoint as YAML files, submit or deploy it to a workspace",
        ["trainbook azure plan --help"],
    )
    sub = add_verbs(azure, "azure_verb")
    for add in AZURE_VERBS:
        add(sub)
