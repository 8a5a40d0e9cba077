"""``trainbook azure ...``: plan an Azure ML job into a folder of YAML files, submit a plan to a workspace.

Only argparse at import time: the parser is built on every CLI call, azure.ai.ml loads when a verb runs.
"""

from __future__ import annotations

import sys


def _cmd_plan(args) -> int:
    from toolkit import config as config_mod
    from toolkit.azure.connection import workspace_ref
    from toolkit.azure.plan import build_plan, write_plan

    cfg = config_mod.load(args.config, list(args.set or []))
    ref = workspace_ref(args.workspace_config) if args.workspace_config else None
    plan = build_plan(cfg, compute=args.compute, sku=args.sku, instance_count=args.instance_count,
                      gpus_per_node=args.gpus_per_node, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
                      idle_seconds=args.idle_seconds, low_priority=args.low_priority, image=args.image,
                      workspace=ref, conda_file=args.conda_file)
    out = write_plan(plan, args.out)
    print(plan.summary())
    print(f"{'plan':<12} {out / 'submit.md'}")
    return 0


def _cmd_submit(args) -> int:
    from toolkit.azure.connection import workspace_ref
    from toolkit.azure.submit import submit

    ref = workspace_ref(args.workspace_config, subscription_id=args.subscription,
                        resource_group=args.resource_group, workspace_name=args.workspace_name)
    try:
        submit(args.plan_dir, ref, stream=not args.no_stream)
    except KeyboardInterrupt:
        print("interrupted: the job keeps running in Azure ML (see its studio page)", file=sys.stderr)
        return 130
    return 0


def _add_plan(verbs) -> None:
    from toolkit.azure.plan import DEFAULT_IDLE_SECONDS

    plan = verbs.add_parser("plan", help="validate and write compute/environment/data/job YAML and submit.md")
    plan.add_argument("config", help="a YAML file, or the name of one in configs/ (e.g. tiny, demo)")
    plan.add_argument("--compute", required=True, help="AmlCompute cluster name (3-24 letters, digits, '-')")
    plan.add_argument("--sku", required=True, help="VM size of one node, e.g. Standard_NC24ads_A100_v4")
    plan.add_argument("--instance-count", type=int, required=True, help="nodes the job runs on")
    plan.add_argument("--gpus-per-node", type=int,
                      help="processes per node on a GPU size, 1 to its GPU count (default: all its GPUs)")
    plan.add_argument("--min-nodes", type=int, default=0, help="nodes kept when idle (default: 0)")
    plan.add_argument("--max-nodes", type=int, help="cluster size limit (default: --instance-count)")
    plan.add_argument("--idle-seconds", type=int, default=DEFAULT_IDLE_SECONDS,
                      help=f"idle time before a node is released (default: {DEFAULT_IDLE_SECONDS})")
    plan.add_argument("--low-priority", action="store_true", help="low-priority nodes: cheaper, can be preempted")
    plan.add_argument("--image", help="base image (default: the current ACPT curated image)")
    plan.add_argument("--conda-file", help="conda environment file (default: the project's environment.yml)")
    plan.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                      help="override one config field (repeatable), e.g. --set engine.name=deepspeed")
    plan.add_argument("--workspace-config", metavar="CONFIG_JSON",
                      help="Azure ML config.json: fills resource group and workspace into submit.md")
    plan.add_argument("--out", required=True, help="plan folder to write (an earlier plan there is replaced)")
    plan.set_defaults(func=_cmd_plan)


def _add_submit(verbs) -> None:
    submit = verbs.add_parser("submit", help="create a plan's compute, environment, data and job; stream its log")
    submit.add_argument("plan_dir")
    submit.add_argument("--workspace-config", metavar="CONFIG_JSON",
                        help="Azure ML config.json (default: ./config.json, then ./.azureml/config.json)")
    submit.add_argument("--subscription", help="subscription id (with --resource-group and --workspace-name)")
    submit.add_argument("--resource-group")
    submit.add_argument("--workspace-name")
    submit.add_argument("--no-stream", action="store_true", help="return once the job is submitted")
    submit.set_defaults(func=_cmd_submit)


AZURE_VERBS = [_add_plan, _add_submit]
"""Each adds one ``trainbook azure`` sub-verb; deployment verbs append theirs here."""


def add_azure_verbs(verbs) -> None:
    """Add ``azure`` and its sub-verbs to the top-level subparsers of the trainbook CLI."""
    azure = verbs.add_parser("azure", help="Azure ML: plan a training job as YAML files, submit it to a workspace")
    sub = azure.add_subparsers(dest="azure_verb", required=True)
    for add in AZURE_VERBS:
        add(sub)
