"""``trainbook forecast``: a full run's time, cost and failures on Azure sizes and node counts (or this machine),
from a config or a parameter count, each input named with where it came from (toolkit.azure.forecast)."""

from __future__ import annotations

from toolkit.cli.common import add_json, add_set, print_json
from toolkit.cli.conventions import add_verb


def register(verbs) -> None:
    forecast = add_verb(
        verbs,
        "forecast",
        "a full run's time, GPU-hours, cost, interruptions and memory per GPU on Azure sizes and node counts, "
        "before you book them",
        [
            "trainbook forecast --params 7B --tokens 140B --sku Standard_ND96isr_H100_v5 --nodes 1,2,4,8",
            "trainbook forecast llama --sku Standard_ND96asr_v4 --nodes 4 --mfu run:runs/llama-...",
            "trainbook forecast demo --sku local --tokens 2M --mfu run:runs/demo-...",
        ],
    )
    forecast.add_argument("config", nargs="?", help="a config whose model (and batch) to forecast; or --params")
    add_set(forecast)
    forecast.add_argument("--params", help="parameters instead of a config: 350M, 7B, 1.3e9")
    forecast.add_argument("--layers", type=int, default=0, help="with --params: layers (for the attention FLOPs)")
    forecast.add_argument("--width", type=int, default=0, help="with --params: hidden size")
    forecast.add_argument("--seq", type=int, default=0, help="with --params: tokens a sequence")
    forecast.add_argument("--batch-per-gpu", type=int, help="sequences a GPU takes a step (for the step time)")
    forecast.add_argument("--tokens", help="the token budget: 300B, 2M; default 20 per parameter (Chinchilla)")
    forecast.add_argument(
        "--sku", action="append", required=True, help="an Azure VM size, or 'local' (this machine); repeatable"
    )
    forecast.add_argument("--nodes", default="1", help="node counts, comma-separated (default 1)")
    forecast.add_argument(
        "--mfu",
        default="azure",
        help="the share of the peak reached: a number (0.4), 'azure' (Azure's published 157 of 312 TFLOPs, the "
        "default), 'run:RUN_DIR' (measured here) or 'gpu-report:FILE' (bench/gpu_check.sh's gpu_check.json)",
    )
    forecast.add_argument("--tflops", type=float, help="instead of --mfu: TFLOP/s reached per GPU")
    forecast.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), help="default: the lowest that fits")
    forecast.add_argument(
        "--price", action="append", default=[], metavar="SKU=USD_PER_HOUR", help="a node-hour's price; repeatable"
    )
    forecast.add_argument("--mtbf-gpu-hours", type=float, help="GPU-hours between failures (default: Llama 3's)")
    forecast.add_argument("--restart-minutes", type=float, help="a restart's time (default 10)")
    forecast.add_argument(
        "--checkpoint-seconds", type=float, help="training time a checkpoint costs (default: estimated)"
    )
    forecast.add_argument("--plot", metavar="PNG", help="also draw time against cost over the sizes and node counts")
    add_json(forecast, "the forecast and its sources")
    forecast.set_defaults(func=cmd_forecast)


def cmd_forecast(args) -> int:
    from toolkit.azure import forecast as fc

    if args.plot:
        from toolkit.report.plots import picture_path

        picture_path(args.plot, "--plot")  # refused before anything is computed or drawn
    model, batch, precision, stage = _model(args, fc)
    prices = {}
    for item in args.price:
        prices.update(_price(fc, item))
    given = {  # flag -> the forecast's input, each only when given
        "mtbf_gpu_hours": (args.mtbf_gpu_hours, "--mtbf-gpu-hours", 1),
        "checkpoint_cost": (args.checkpoint_seconds, "--checkpoint-seconds", 1),
        "restart": (args.restart_minutes, "--restart-minutes", 60),
    }
    options = {
        key: fc.Sourced(scale * fc.positive(flag, value), "given")
        for key, (value, flag, scale) in given.items()
        if value is not None
    }
    report = fc.forecast_sizes(
        model,
        args.sku,
        fc.node_counts(args.nodes),
        tokens=args.tokens,
        mfu=args.mfu,
        tflops=args.tflops,
        precision=precision,
        zero_stage=args.zero_stage if args.zero_stage is not None else stage,
        prices=prices,
        batch_per_gpu=args.batch_per_gpu or batch,
        **options,
    )
    if args.plot:
        from toolkit.report.plots import forecast_plot

        forecast_plot([row.to_dict() for row in report.rows], args.plot)
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.text())
        if args.plot:
            print(f"\nplot: {args.plot}")
    return 0


def _price(fc, item: str) -> dict:
    """{size (lower case): the price} from one --price SKU=USD_PER_HOUR, refused naming --price and the item."""
    from toolkit.azure.errors import AzureError
    from toolkit.errors import not_allowed

    size, sep, usd = item.partition("=")
    allowed = "SIZE=USD_PER_HOUR, a known VM size (or local) and a price above 0"
    try:
        name = fc.LOCAL if size.strip().lower() == fc.LOCAL else fc.get_sku(size).name
        price = float(usd)
    except (AzureError, ValueError):
        raise AzureError(not_allowed("--price", item, allowed)) from None
    if not sep or not price > 0 or price == float("inf"):
        raise AzureError(not_allowed("--price", item, allowed))
    return {name.lower(): fc.Sourced(price, "given")}


def _model(args, fc):
    """(ModelShape, sequences per GPU a step or None, precision, ZeRO stage or None) from --params or the config."""
    from toolkit.azure.errors import AzureError
    from toolkit.errors import not_allowed

    if args.params and args.config:
        raise AzureError(not_allowed("--params", args.params, "either a config or --params", problem="given with one"))
    for flag, value in (("--layers", args.layers), ("--width", args.width), ("--seq", args.seq)):
        if value < 0 or (value and args.config):
            raise AzureError(
                not_allowed(flag, value, "a whole number of 1 or more, with --params (a config gives its own shape)")
            )
    if args.params:
        shape = fc.ModelShape(
            fc.count("--params", args.params), args.layers, args.width, args.seq, f"{args.params} given"
        )
        return shape, None, "bf16", None
    if not args.config:
        raise AzureError(not_allowed("config", None, "a config (demo, llama, a YAML path) or --params 7B"))
    from toolkit import config as config_mod
    from toolkit.cli.common import config_overrides

    return fc.shape_of_config(config_mod.load(args.config, config_overrides(args.set)), name=f"config {args.config}")
