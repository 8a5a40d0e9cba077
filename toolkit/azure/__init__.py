"""Azure ML: turn a Trainbook config into azure-ai-ml entities (compute, environment, data, command job), write
them as a plan folder of YAML files, and submit that plan to a workspace.

Import-light on purpose: azure.ai.ml (~2 s) and azure.identity load inside the functions that need them.

    plan.build_plan(cfg, compute=..., sku=..., instance_count=...)  validate and build the entities
    plan.write_plan(plan, out_dir)                                  compute/environment/data/job YAML + submit.md
    submit.submit(plan_dir, workspace_ref)                          create them in a workspace and stream the job

and the serving side, the Azure ML twin of the local online endpoint:

    deploy_plan.build_deployment_plan(model, endpoint=..., sku=...)  validate an exported model and the options
    deploy_plan.write_deployment_plan(plan, out_dir)                endpoint/deployment YAML + deploy.md
    deploy.deploy(plan_dir, workspace_ref)                          create them, route all traffic, scoring URI
"""

from toolkit.azure.errors import AzureError

__all__ = ["AzureError"]
