"""``trainbook estimate``: peak memory per rank of a run (predicted, or against a finished run's measurement), model
state per GPU by ZeRO stage, and the recommended setting as a config."""

from __future__ import annotations

from toolkit.cli.common import add_set, config_overrides
from toolkit.cli.conventions import add_verb
from toolkit.config import ConfigError
from toolkit.errors import not_allowed, refused


def register(verbs) -> None:
    from toolkit.config import EngineConfig, field_choices

    est = add_verb(
        verbs,
        "estimate",
        "peak memory per rank of a run (predicted, or against a finished run's "
        "measurement), model state per GPU by ZeRO stage, and the recommended setting as a config",
        [
            "trainbook estimate 7B --gpus 8 --gpu-memory 80",
            "trainbook estimate --config tiny --nproc 2 --engine deepspeed --zero-stage 2",
            "trainbook estimate --run runs/tiny-20261126-101500",
            "trainbook estimate 7B --gpus 8 --gpu-memory 80 --write-config zero.yaml",
            "trainbook estimate --config demo --gpus 2 --write-config demo-zero.yaml",
        ],
    )
    est.add_argument("params", nargs="?", help="parameter count with its unit: 350M, 7B, 1.3e9 (or use --config)")
    est.add_argument("--config", help="predict this config's run: peak memory per rank on this machine")
    add_set(est, "override one field of --config (repeatable)")
    est.add_argument("--nproc", type=int, help="processes for --config's run (engine.nproc)")
    est.add_argument(
        "--engine", choices=field_choices(EngineConfig, "name"), help="engine for --config's run (engine.name)"
    )
    est.add_argument("--device", choices=["cpu", "cuda"], help="predict for this device (default: this machine's)")
    est.add_argument(
        "--run",
        metavar="RUN_DIR",
        help="compare a run's measured peak per rank (its last train event) with the prediction for its own config",
    )
    est.add_argument(
        "--measure-baseline",
        action="store_true",
        help="first measure this machine's baseline (the "
        "tiny config's peak, ~30 s per engine) and keep it for later predictions",
    )
    est.add_argument(
        "--write-config",
        metavar="FILE.yaml",
        help="write the recommended setting (ZeRO stage, "
        "processes, precision; offload when no stage fits) as a config that trains",
    )
    est.add_argument(
        "--precision",
        choices=["fp16", "bf16", "fp32"],
        help="for the GPU figures (default: --config's engine.precision, else bf16)",
    )
    est.add_argument("--gpus", type=int, default=8, help="GPUs in all (default: 8)")
    est.add_argument(
        "--tensor-parallel",
        type=int,
        help="GPUs each layer is split over; ZeRO partitions over the rest (default: --config's "
        "engine.tensor_parallel, else 1)",
    )
    est.add_argument(
        "--pipeline-parallel",
        type=int,
        help="pipeline stages, each holding its share of the layers; ZeRO partitions over the rest (default: "
        "--config's engine.pipeline_parallel, else 1)",
    )
    est.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU (default: 80, an A100/H100 80GB)")
    est.add_argument(
        "--zero-stage",
        type=int,
        choices=[0, 1, 2, 3],
        help="show only this stage's GPU figure (and, with --config on the deepspeed engine, predict that stage)",
    )
    est.set_defaults(func=cmd_estimate)


def cmd_estimate(args) -> int:
    from toolkit import config as config_mod
    from toolkit.azure import recommended_config
    from toolkit.resources import memory_baseline, memory_model, zero_stages

    overrides = config_overrides(args.set, nproc=args.nproc, engine=args.engine)
    if overrides and not args.config:
        raise ConfigError(refused("--set/--nproc/--engine", "given without --config", "--config NAME with them"))
    if args.run and (args.config or args.params):
        raise ConfigError(
            not_allowed(
                "--run",
                args.run,
                "--run alone (the run's own config is what it measured)",
                problem="is given together with " + ("--config" if args.config else "a count"),
            )
        )
    cfg = config_mod.load(args.config, overrides) if args.config else None
    if cfg is not None and args.zero_stage is not None and cfg.engine.name == "deepspeed":
        cfg = config_mod.load(args.config, [*overrides, f"engine.zero_stage={args.zero_stage}"])
    if args.measure_baseline:
        from toolkit.rundir import RunDir

        engines = (
            [cfg.engine.name]
            if cfg
            else [RunDir(args.run).read_config().engine.name]
            if args.run
            else list(memory_baseline.REFERENCE_BASELINE_MIB)
        )
        for engine in engines:
            print(
                f"measuring the {engine} baseline: the tiny config for {memory_baseline.BASELINE_STEPS} steps on 2 "
                "processes...",
                flush=True,
            )
            peaks = memory_baseline.measure_baseline(engine)
            print(
                f"  {engine}: {', '.join(f'rank {r} {p:,.0f} MiB' for r, p in enumerate(peaks))} (kept in "
                f"{memory_baseline.baseline_cache_path()})"
            )
    if args.run:
        comparison = memory_model.compare_run(args.run, device=args.device)
        print(comparison.prediction.table())
        print(comparison.table())
        return 0
    params: float
    if cfg is not None:
        prediction = memory_model.predict_run(cfg, device=args.device)
        params, precision = prediction.whole_params or prediction.params, args.precision or cfg.engine.precision
        split = args.tensor_parallel or cfg.engine.tensor_parallel
        stages = args.pipeline_parallel or cfg.engine.pipeline_parallel
        print(f"model: {params:,.0f} parameters ({params / 1e9:.3g}B)")
        print(prediction.table())
        at = (f", tensor_parallel {split}" if split > 1 else "") + (
            f", pipeline_parallel {stages}" if stages > 1 else ""
        )
        print(f"\non GPUs: model state per GPU by ZeRO stage ({precision}, {args.gpus} GPUs{at}):")
    elif args.params:
        params, precision = zero_stages.parse_count(args.params), args.precision or "bf16"
        split, stages = args.tensor_parallel or 1, args.pipeline_parallel or 1
        print(f"model: {params:,.0f} parameters ({params / 1e9:.3g}B)")
    else:
        raise ConfigError(
            refused("params", "missing", "a parameter count such as 350M, 7B or 1.3e9, --config NAME or --run RUN_DIR")
        )
    if args.zero_stage is not None:
        print(zero_stages.estimate(params, precision, args.zero_stage, args.gpus, split, stages).formula())
    else:
        print(zero_stages.recommend_stage(params, args.gpu_memory, args.gpus, precision, split, stages).summary())
    if stages > 1:
        print(
            "  (DeepSpeed's pipeline engine takes ZeRO-1 at most; Trainbook's stages run on the torch engine, ZeRO-0)"
        )
    if args.write_config:
        written = recommended_config.write_recommended_config(
            args.write_config,
            params=None if cfg else params,
            base=args.config,
            overrides=overrides,
            gpus=args.gpus,
            gpu_memory_gib=args.gpu_memory,
            precision=precision,
        )
        print(f"\n{written.summary()}")
    return 0
